package dbsql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
)

// The errors a host meets first when llmq is set up wrongly say the fix:
// a missing table names the schema and its setting; a statement of pgx's
// statement cache that the server lost or already had (what a transaction
// pooler does to it) names the exec modes that work. Other errors pass
// as they are. The errors are PostgreSQL's own, provoked on one
// connection as a pooler provokes them across several.
func TestExplainSaysTheFix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := dbtest.Pool(t, 1)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pg := conn.Conn().PgConn()

	_, err = conn.Exec(ctx, "SELECT * FROM llmq_explain_no_such_schema.jobs")
	explained := dbsql.Explain(err, "llmq_explain_no_such_schema", "jobs.Config.Schema")
	require.ErrorIs(t, explained, llmqtype.ErrNotMigrated)
	require.Contains(t, explained.Error(), "jobs.Config.Schema")

	// A column a later migration adds: the schema is behind the code.
	_, err = conn.Exec(ctx, "SELECT no_such_column FROM pg_class")
	explained = dbsql.Explain(err, "llmq", "jobs.Config.Schema")
	require.ErrorIs(t, explained, llmqtype.ErrNotMigrated)
	require.Contains(t, explained.Error(), `schema "llmq" is migrated to an older version than this code needs`)
	require.Contains(t, explained.Error(), "llmq migrate up -schema llmq")

	// The server lost the statement: another server connection had it.
	missing := pg.ExecPrepared(ctx, "stmtcache_0123456789abcdef", nil, nil, nil).Read().Err
	require.True(t, dbsql.StatementCacheLost(missing), "%v", missing)
	// The server already had one of that name: another client prepared it.
	_, err = pg.Prepare(ctx, "stmtcache_0123456789abcdef", "SELECT 1", nil)
	require.NoError(t, err)
	_, dup := pg.Prepare(ctx, "stmtcache_0123456789abcdef", "SELECT 1", nil)
	require.True(t, dbsql.StatementCacheLost(dup), "%v", dup)
	require.NoError(t, pg.Deallocate(ctx, "stmtcache_0123456789abcdef"))
	for _, err := range []error{missing, dup} {
		explained := dbsql.Explain(err, "llmq", "jobs.Config.Schema")
		require.ErrorIs(t, explained, llmqtype.ErrStatementCache)
		require.ErrorIs(t, explained, err, "the database's error stays in the chain")
		require.Contains(t, explained.Error(), "default_query_exec_mode=exec")
	}

	// A prepared statement of the host's own is not pgx's cache: its loss
	// says nothing about a pooler.
	own := pg.ExecPrepared(ctx, "my_statement", nil, nil, nil).Read().Err
	var pgErr *pgconn.PgError
	require.ErrorAs(t, own, &pgErr)
	require.False(t, dbsql.StatementCacheLost(own))
	require.Equal(t, own, dbsql.Explain(own, "llmq", "jobs.Config.Schema"))
	for _, other := range []error{nil, context.Canceled, pgx.ErrNoRows, errors.New("boom")} {
		require.Equal(t, other, dbsql.Explain(other, "llmq", "jobs.Config.Schema"))
	}
}
