package llmqtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbsql/dbsqltest"
	"github.com/llmq/llmq/internal/dbtest"
)

// Every statement of queries.sql matches what the code binds and scans.
// Not dbsqltest.Check: Clear calls the function Capture writes, so the
// schema is captured first, as prepare does, before the statements are
// described.
func TestStatements(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := dbtest.Setup(t)
	schema, err := dbsql.NewSchema(db.Schema)
	require.NoError(t, err)
	var q statements
	set, err := q.load(schema)
	require.NoError(t, err)
	require.Empty(t, dbsqltest.Unfilled(&q), "fields no spec filled")
	_, err = db.Pool.Exec(ctx, q.createCapture)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, q.capture, db.Schema)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, err := range dbsqltest.Verify(ctx, conn.Conn(), set) {
		t.Error(err)
	}
}
