package webhook_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// A failing endpoint opens its breaker for every dispatcher: a second runner
// defers its deliveries without sending them, while a healthy endpoint of the
// same tenant is served as usual; after the cool-down one probe goes, and its
// success closes the breaker for all. The cool-down is an hour, which the
// test passes by moving the breaker's and the deferred deliveries' times
// back: a cool-down of seconds could pass before the second runner's first
// attempt on a loaded machine, which then rightly sends a probe.
func TestBreakerIsSharedByDispatchersAndPerEndpoint(t *testing.T) {
	t.Parallel()
	const threshold = 3
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
	breaker := webhook.DispatcherConfig{BreakerThreshold: threshold, BreakerCooldown: time.Hour}

	jobsOf := map[uuid.UUID][]uuid.UUID{}   // endpoint -> delivery jobs
	deliveryOf := map[uuid.UUID]uuid.UUID{} // job -> delivery
	enqueue := func(count int) {
		for range count {
			for _, d := range f.enqueue(webhook.Event{}) {
				jobsOf[d.EndpointID] = append(jobsOf[d.EndpointID], d.JobID)
				deliveryOf[d.JobID] = d.ID
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
	require.Equal(t, threshold, sent, "one delivery in flight per endpoint, and the breaker stopped the rest")

	// Runner B sees the breaker runner A opened. Runner A may have deferred
	// the endpoint's next delivery, which holds the rest of its deliveries
	// behind it, until the cool-down ends: bring the deferred ones due now,
	// while the breaker stays open.
	dueNow := func() {
		t.Helper()
		_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".jobs SET available_at = now() WHERE id = ANY ($1) AND state = 'RETRY_SCHEDULED'", dbsql.UUIDs(jobsOf[bad.ID]))
		require.NoError(t, err)
	}
	dueNow()
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

	// The endpoint recovers and the cool-down passes; a probe closes the
	// breaker and the backlog drains.
	recovered.Store(true)
	_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".webhook_endpoints SET breaker_until = now() WHERE id = $1", bad.ID)
	require.NoError(t, err)
	dueNow()
	for _, id := range jobsOf[bad.ID] {
		require.Equal(t, jobs.StateSucceeded, f.await(id).State)
	}
	ep, err := f.store.Endpoint(t.Context(), f.pool, tenant, bad.ID)
	require.NoError(t, err)
	require.Equal(t, webhook.BreakerClosed, ep.Breaker)
	require.Zero(t, ep.BreakerFails)
	byRunner := map[string]int{}
	for _, id := range jobsOf[bad.ID] {
		for _, a := range f.attempts(deliveryOf[id]) {
			if a.Status == http.StatusBadGateway {
				byRunner[a.Worker]++
			}
		}
	}
	require.Equal(t, sent, byRunner["runner-a"], "every attempt is recorded under its runner")
	require.LessOrEqual(t, byRunner["runner-b"], 1, "runner B sent at most one failing probe")
	for _, id := range jobsOf[good.ID] {
		attempts, err := f.jobs.Attempts(t.Context(), f.pool, tenant, id)
		require.NoError(t, err)
		for _, a := range attempts {
			require.NotEqual(t, jobs.AttemptSnoozed, a.Outcome, "the healthy endpoint's deliveries were never deferred")
		}
	}
}

// However many dispatchers ask at once after the cool-down, exactly one is
// let through as the probe; a failed probe re-opens the breaker.
func TestBreakerAdmitsExactlyOneProbe(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	ep, _ := f.register(statusServer(&h, always(http.StatusServiceUnavailable)))
	dispatchers := []*webhook.Dispatcher{
		f.dispatcher(webhook.DispatcherConfig{}), f.dispatcher(webhook.DispatcherConfig{}),
	}
	open := func() {
		_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".webhook_endpoints SET breaker_state = 'open', breaker_until = now() - interval '1 second' WHERE id = $1", ep.ID)
		require.NoError(t, err)
	}
	open()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			ok, err := webhook.Admit(context.Background(), dispatchers[i%2], tenant, ep.ID)
			if err == nil && ok {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(1), admitted.Load())
	got, err := f.store.Endpoint(t.Context(), f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Equal(t, webhook.BreakerHalfOpen, got.Breaker)

	// The probe (a real delivery) fails: the breaker opens again.
	open()
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: dispatchers[0]}))
	require.Eventually(t, func() bool {
		got, err := f.store.Endpoint(t.Context(), f.pool, tenant, ep.ID)
		return err == nil && got.Breaker == webhook.BreakerOpen && got.BreakerUntil.After(time.Now())
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, h.count(), "one probe")
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, http.StatusServiceUnavailable, attempts[0].Status)
}
