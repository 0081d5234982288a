package webhook_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// A failing endpoint opens its breaker for every dispatcher: a second runner
// defers its deliveries without sending them, while a healthy endpoint of the
// same tenant is served as usual; after the cool-down one probe goes, and its
// success closes the breaker for all.
func TestBreakerIsSharedByDispatchersAndPerEndpoint(t *testing.T) {
	t.Parallel()
	const threshold, workers = 3, 4
	sched := []time.Duration{0}
	for range 30 {
		sched = append(sched, 20*time.Millisecond)
	}
	f := setup(t, sched...)
	var failing, healthy hits
	var recovered atomic.Bool
	bad, _ := f.register(statusServer(&failing, func(int) int {
		if recovered.Load() {
			return http.StatusNoContent
		}
		return http.StatusBadGateway
	}))
	good, _ := f.register(statusServer(&healthy, always(http.StatusNoContent)))
	breaker := webhook.DispatcherConfig{BreakerThreshold: threshold, BreakerCooldown: 5 * time.Second}

	var jobsOf = map[uuid.UUID][]uuid.UUID{}
	enqueue := func(count int) {
		for range count {
			for _, d := range f.enqueue(webhook.Event{}) {
				jobsOf[d.EndpointID] = append(jobsOf[d.EndpointID], d.JobID)
			}
		}
	}
	enqueue(4)
	cfgA := runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(breaker)})
	cfgA.WorkerID = "runner-a"
	stopA := f.start(cfgA)
	require.Eventually(t, func() bool {
		ep, err := f.store.Endpoint(t.Context(), f.pool, tenant, bad.ID)
		return err == nil && ep.Breaker == webhook.BreakerOpen
	}, 10*time.Second, 5*time.Millisecond)
	stopA()
	sent := failing.count()
	require.GreaterOrEqual(t, sent, threshold)
	require.LessOrEqual(t, sent, threshold+workers, "the breaker stopped the sends that were not already in flight")

	// Runner B sees the breaker runner A opened.
	enqueue(2)
	cfgB := runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(breaker)})
	cfgB.WorkerID = "runner-b"
	f.start(cfgB)
	snoozedByB := func() bool {
		for _, id := range jobsOf[bad.ID] {
			attempts, err := f.jobs.Attempts(t.Context(), f.pool, tenant, id)
			require.NoError(t, err)
			for _, a := range attempts {
				if a.Outcome == jobs.AttemptSnoozed && a.Worker == "runner-b" {
					return true
				}
			}
		}
		return false
	}
	require.Eventually(t, snoozedByB, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, sent, failing.count(), "nothing was sent to the open endpoint")
	for _, id := range jobsOf[good.ID] {
		require.Equal(t, jobs.StateSucceeded, f.await(id).State, "the healthy endpoint is unaffected")
	}
	require.Equal(t, 6, healthy.count())
	for _, id := range jobsOf[bad.ID] {
		job, err := f.jobs.Get(t.Context(), f.pool, tenant, id)
		require.NoError(t, err)
		require.False(t, job.State.Terminal(), "deferred, not failed")
	}

	// The endpoint recovers; after the cool-down a probe closes the breaker
	// and the backlog drains.
	recovered.Store(true)
	for _, id := range jobsOf[bad.ID] {
		require.Equal(t, jobs.StateSucceeded, f.await(id).State)
	}
	ep, err := f.store.Endpoint(t.Context(), f.pool, tenant, bad.ID)
	require.NoError(t, err)
	require.Equal(t, webhook.BreakerClosed, ep.Breaker)
	require.Zero(t, ep.BreakerFails)
	for _, id := range jobsOf[good.ID] {
		attempts, err := f.jobs.Attempts(t.Context(), f.pool, tenant, id)
		require.NoError(t, err)
		for _, a := range attempts {
			require.NotEqual(t, jobs.AttemptSnoozed, a.Outcome, "the healthy endpoint's deliveries were never deferred")
		}
	}
}
