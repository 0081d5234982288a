package admission_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// A job that reuses a result already paid for takes no permit and adds
// nothing to the usage ledger: of three jobs with one key, the provider
// hears of one, the pool's buckets hold one request's spend, and the
// ledger bills one attempt.
func TestReusedResultsTakeNoPermitAndCostNothing(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	var calls atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		_, _ = w.Write([]byte(`{"usage": 40}`))
	}))
	t.Cleanup(provider.Close)
	pool := slow("reuse")
	pool.InputPrice = 2_000_000
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	f.start(runnerConfig(f.pg, pool.Name, provider.URL, "w"))

	enqueue := func() uuid.UUID {
		res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "extract",
			Reuse: &jobs.Reuse{Key: "sha256:invoice-7"}})
		require.NoError(t, err)
		return res.Job.ID
	}
	first := enqueue()
	f.awaitAll([]uuid.UUID{first}, 10*time.Second)
	later := []uuid.UUID{enqueue(), enqueue()}
	f.awaitAll(later, 10*time.Second)
	for _, id := range later {
		j := f.job(id)
		require.Equal(t, jobs.StateSucceeded, j.State)
		require.Equal(t, first, j.ReusedFrom)
	}
	require.Equal(t, int32(1), calls.Load(), "one provider call for the three jobs")

	s, err := f.pg.State(t.Context(), pool.Name)
	require.NoError(t, err)
	require.Zero(t, s.InFlight)
	require.InDelta(t, 9, s.RequestLevel, 0.1, "one request taken from a burst of 10")
	usage, err := f.pg.Usage(t.Context(), "acme", time.Now(), time.Now())
	require.NoError(t, err)
	require.Len(t, usage, 1)
	require.Equal(t, int64(1), usage[0].Attempts)
	require.Equal(t, int64(40*2), usage[0].Cost, "the one call's 40 input tokens at 2 micro-units each")
}
