package dbsql_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbtest"
)

// fn fails because its context ended after one of its writes: the write is
// rolled back with its savepoint, so committing the enclosing transaction
// commits none of it.
func TestWithTxRollsBackASavepointWhoseContextEnded(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	_, err := db.Pool.Exec(t.Context(), "CREATE SCHEMA "+db.Schema+"; CREATE TABLE "+db.Schema+".writes (step text)")
	require.NoError(t, err)
	outer, err := db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = outer.Rollback(context.Background()) }()

	ctx, cancel := context.WithCancel(t.Context())
	err = dbsql.WithTx(ctx, outer, func(sp pgx.Tx) error {
		if _, err := sp.Exec(ctx, "INSERT INTO "+db.Schema+".writes VALUES ('first')"); err != nil {
			return err
		}
		cancel()
		_, err := sp.Exec(ctx, "INSERT INTO "+db.Schema+".writes VALUES ('second')")
		return err
	})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, dbsql.ErrSavepointLeftOpen, "the savepoint was rolled back")
	require.NoError(t, outer.Commit(t.Context()))
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+db.Schema+".writes").Scan(&n))
	require.Zero(t, n, "the savepoint's first write committed")
}
