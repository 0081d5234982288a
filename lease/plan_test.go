package lease_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// A runner's connections keep each statement's plan until the table's
// statistics change. A runner that started on a few jobs planned its claims
// and completions on a table of one page, where a sequential scan is the
// cheapest plan, and kept those plans while a burst filled the table: 50
// jobs, then 100,000, read about a billion rows of jobs in 10,000 scans
// (docs/performance.md). The claim and the fenced statements turn
// sequential scans off for themselves, so a burst after a small start is
// worked through the indexes: the runner's sessions read almost nothing of
// jobs by scanning it.
func TestARunnerStartedOnFewJobsMeetsABurstThroughItsIndexes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// The runner's own sessions, which report their statistics when they
	// end.
	runnerPool, err := pgxpool.New(t.Context(), dbtest.URL())
	require.NoError(t, err)
	defer runnerPool.Close()
	var ran atomic.Int64
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		ran.Add(1)
		return json.RawMessage(`{}`), nil
	})})
	cfg.Queues = map[string]lease.QueueConfig{"default": {MaxWorkers: 200}}
	cfg.ClaimBatch = 100
	// The periodic reads (reaper, deadlines, unserved kinds) are not what is
	// measured; they keep to their minute.
	cfg.ReapInterval, cfg.UnservedKinds = time.Minute, time.Minute
	r, err := lease.NewRunner(runnerPool, f.store, cfg)
	require.NoError(t, err)
	stop := sync.OnceValue(r.Start(t.Context()))
	defer func() { _ = stop() }()

	const few, burst = 20, 20_000
	for i := range few {
		f.enqueue(jobs.EnqueueParams{Tenant: "t", Kind: "k"})
		require.Eventually(t, func() bool { return ran.Load() == int64(i+1) }, 10*time.Second, time.Millisecond)
	}
	params := make([]jobs.EnqueueParams, jobs.MaxBatch)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "t", Kind: "k"}
	}
	for range burst / jobs.MaxBatch {
		_, err := f.store.EnqueueMany(t.Context(), f.pool, params)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return ran.Load() == few+burst }, time.Minute, 10*time.Millisecond)
	require.NoError(t, stop())
	runnerPool.Close()

	// Each job was claimed and completed by the runner's sessions: once
	// their updates are counted, so are their scans.
	scanned := dbtest.ScannedRows(t, f.pool, f.schema, "jobs", "n_tup_upd", 2*(few+burst))
	t.Logf("the runner's sessions read %d rows of jobs by scanning it", scanned)
	require.Less(t, scanned, int64(burst), "the runner's statements scanned jobs")
}
