package pgcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgcluster"
)

// A cluster keeps its data and its URL across a fast stop, a start, a
// restart and a crash; while it is down, connecting fails, and a pool built before reconnects by itself.
func TestClusterStopsAndStartsOnItsData(t *testing.T) {
	t.Parallel()
	c := pgcluster.New(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
	require.NoError(t, err)

	require.NoError(t, c.Stop(t.Context()))
	_, err = pgx.Connect(ctx, c.URL())
	require.ErrorContains(t, err, "connect")
	require.NoError(t, c.Start(t.Context()))
	requireKept(t, pool, 1)

	require.NoError(t, c.Restart(t.Context(), 100*time.Millisecond))
	// The pool's connection from before the restart fails once (57P01),
	// and is replaced.
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, "INSERT INTO kept VALUES (2)")
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, c.Crash(t.Context()))
	require.NoError(t, c.Start(t.Context()))
	requireKept(t, pool, 2)
}

// requireKept waits for the pool to reach the cluster again and checks
// that the table holds n rows.
func requireKept(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var got int
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return pool.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&got) == nil
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, n, got)
}
