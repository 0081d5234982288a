package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// fillFinished writes n finished jobs of queue set-based, finished one
// minute apart going back from ago, as history a host keeps.
func (f *fixture) fillFinished(t *testing.T, queue string, state jobs.State, n int, ago time.Duration) {
	t.Helper()
	_, err := f.pool.Exec(t.Context(), `INSERT INTO `+f.schema+`.jobs (id, tenant, kind, queue, payload, state, attempt, max_attempts, finished_at)
		SELECT gen_random_uuid(), 'acme', 'k', $1, '{}', $2, 1, 1, now() - $3 * interval '1 millisecond' - g * interval '1 minute'
		FROM generate_series(0, $4 - 1) AS g`, queue, string(state), ago.Milliseconds(), n)
	require.NoError(t, err)
}

// Stats counts every waiting and running job, and finished jobs only
// within StatsWindow: the history's size is not its business (it would
// have to read it all).
func TestStatsCountsFinishedJobsWithinTheWindow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	for range 2 {
		_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
		require.NoError(t, err)
	}
	claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	f.fillFinished(t, "default", jobs.StateSucceeded, 3, 0)                           // now, 1 and 2 minutes ago
	f.fillFinished(t, "default", jobs.StateFailedTerminal, 1, 10*time.Second)         // inside the window
	f.fillFinished(t, "webhooks", jobs.StateSucceeded, 5, jobs.StatsWindow+time.Hour) // all before it

	stats, err := f.store.Stats(ctx, f.pool)
	require.NoError(t, err)
	require.Len(t, stats, 1, "a queue with only old history has no row: %+v", stats)
	require.Equal(t, "default", stats[0].Queue)
	require.Equal(t, map[jobs.State]int64{
		jobs.StateReady: 1, jobs.StateRunning: 1, jobs.StateSucceeded: 1, jobs.StateFailedTerminal: 1,
	}, stats[0].Counts)
}

// Stats must not read the history: with many finished jobs beside a small
// backlog, no branch of its statement scans jobs, in the generic plan a
// prepared statement ends up with. A sequential scan of jobs here cost
// 0.8-2.4 s at 2M finished jobs.
func TestStatsDoesNotScanJobs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	params := make([]jobs.EnqueueParams, 200)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k"}
	}
	_, err := f.store.EnqueueMany(ctx, f.pool, params)
	require.NoError(t, err)
	_, err = f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 20, LeaseDuration: time.Minute})
	require.NoError(t, err)
	f.fillFinished(t, "default", jobs.StateSucceeded, 40_000, 0)
	f.fillFinished(t, "default", jobs.StateFailedTerminal, 2_000, 0)
	_, err = f.pool.Exec(ctx, "VACUUM ANALYZE "+f.schema+".jobs")
	require.NoError(t, err)

	plan := dbtest.GenericPlan(t, f.pool, f.store.StatsQueryForTest())
	require.NotContains(t, plan, "Seq Scan on jobs", plan)
	require.Contains(t, plan, "jobs_finished_idx", plan)
}

// SizeFinished counts a state exactly up to ExactSizeLimit, and estimates
// it beyond from the planner's statistics (never below the limit).
func TestSizeFinishedCountsThenEstimates(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.fillFinished(t, "default", jobs.StateSucceeded, jobs.ExactSizeLimit+5_000, 0)
	f.fillFinished(t, "default", jobs.StateCancelled, 7, 0)
	_, err := f.pool.Exec(ctx, "ANALYZE "+f.schema+".jobs")
	require.NoError(t, err)
	pruner, err := jobs.NewPruner(f.schema)
	require.NoError(t, err)
	sizes, err := pruner.SizeFinished(ctx, f.pool)
	require.NoError(t, err)
	require.Equal(t, jobs.Size{Rows: 7}, sizes[jobs.StateCancelled])
	require.Equal(t, jobs.Size{}, sizes[jobs.StateFailedTerminal])
	succeeded := sizes[jobs.StateSucceeded]
	require.True(t, succeeded.Estimated)
	require.InEpsilon(t, jobs.ExactSizeLimit+5_000, succeeded.Rows, 0.2)
}
