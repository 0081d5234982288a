package dberr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/internal/dberr/dberrtest"
	"github.com/llmq/llmq/internal/dbtest"
)

// Every error the server or pgx gives for the connection's or the
// server's trouble is the connection's, as it is and wrapped: those a
// pooler in transaction mode gives pgx's statement cache (26000, 42P05),
// a cached plan whose table changed (0A000), a session the server ended,
// a closed or refused connection, a timeout.
func TestConnectionErrorsAreTheConnections(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	for what, err := range dberrtest.ConnectionErrors(t, db.Schema) {
		require.True(t, dberr.Connection(err), "%s: %v (%T)", what, err, err)
		require.True(t, dberr.Connection(fmt.Errorf("jobs: complete: %w", err)), "%s, wrapped", what)
	}
}

// A retry on the same connection gets past the statement cache's errors:
// pgx forgets a statement that failed and prepares it again.
func TestStatementCacheErrorsPassOnTheSameConnection(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	conn := dberrtest.Connect(t)
	const query = "SELECT $1::int + 3"
	var n int
	require.NoError(t, conn.QueryRow(ctx, query, 1).Scan(&n))
	_, err := conn.PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll()
	require.NoError(t, err)
	err = conn.QueryRow(ctx, query, 1).Scan(&n)
	require.Equal(t, "26000", dberrtest.Code(err), "%v", err)
	require.NoError(t, conn.QueryRow(ctx, query, 1).Scan(&n))
}

// What a statement is refused for, and the caller's own cancellation, are
// not the connection's trouble.
func TestStatementErrorsAreNotTheConnections(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	for what, err := range dberrtest.StatementErrors(t, db.Schema) {
		require.False(t, dberr.Connection(err), "%s: %v", what, err)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := dberrtest.Connect(t).Exec(cancelled, "SELECT 1")
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, dberr.Connection(err), "%v", err)
	require.False(t, dberr.Connection(nil))
	require.False(t, dberr.Connection(errors.New("a handler's own error")))
}
