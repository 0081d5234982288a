package llmqtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// A schema handed to the next test is empty but for the migrations' own
// rows, whatever the last test wrote or created, and keeps its migrations.
func TestPrepareClearsAReusedSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := NewDB(t)
	store := db.Jobs(t)
	_, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", IdempotencyKey: "key-1"})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE "+db.Schema+".tenant_limits SET weight = 5")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "CREATE TABLE "+db.Schema+".host_rows (id serial PRIMARY KEY)")
	require.NoError(t, err)

	require.NoError(t, prepare(ctx, db.Pool, db.Schema))

	count := func(table string) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema+"."+table).Scan(&n))
		return n
	}
	for _, table := range []string{"jobs", "job_keys", "outbox", "tenant_queues"} {
		require.Zero(t, count(table), table)
	}
	var weight float64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT weight FROM "+db.Schema+".tenant_limits WHERE tenant = ''").Scan(&weight))
	require.InDelta(t, 1, weight, 0, "the default tenant_limits row is the migration's again")
	require.Equal(t, 1, count("tenant_limits"))
	require.Positive(t, count("migrations"))
	var hostTable bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", db.Schema+".host_rows").Scan(&hostTable))
	require.False(t, hostTable, "a table the last test created is dropped")
	// The key is free again: the same enqueue is a new job.
	res, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", IdempotencyKey: "key-1"})
	require.NoError(t, err)
	require.False(t, res.Existing)
}
