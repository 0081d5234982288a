package webhook_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// statusServer answers the n-th request with status(n), recording when each
// arrived.
func statusServer(h *hits, status func(n int) int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status(h.add(r)))
	})
}

func always(status int) func(int) int { return func(int) int { return status } }

func TestGoneDisablesTheEndpoint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	ep, _ := f.register(statusServer(&h, always(http.StatusGone)))
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))

	job := f.await(d.JobID)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Equal(t, jobs.ClassPermanent, job.ErrorClass)
	require.Equal(t, 1, h.count(), "410 is not retried")
	got, err := f.store.Endpoint(t.Context(), f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Equal(t, webhook.StatusDisabled, got.Status)
	require.Contains(t, got.DisabledReason, "410")
	require.Empty(t, f.enqueue(webhook.Event{}), "a disabled endpoint gets no new deliveries")

	events, err := f.outbox.ListByAggregate(t.Context(), f.pool, ep.ID)
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, webhook.AlertDisabled, events[0].Type)

	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, http.StatusGone, attempts[0].Status)
	require.Equal(t, "disabled", attempts[0].Outcome)
	require.Equal(t, webhook.ClassGone, attempts[0].ErrorClass)
}

func TestBadRequestStops(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	f.register(statusServer(&h, always(http.StatusBadRequest)))
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))

	job := f.await(d.JobID)
	require.Equal(t, jobs.StateFailedTerminal, job.State, "other 4xx are permanent: dead-lettered at once")
	require.Equal(t, 1, job.Attempt)
	require.Equal(t, 1, h.count())
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, "failed", attempts[0].Outcome)

	// A dead-lettered delivery can be replayed, and keeps its delivery id.
	replay, err := f.jobs.Replay(t.Context(), f.pool, jobs.ReplayParams{Tenant: tenant, JobID: d.JobID, By: "ops", Reason: "receiver fixed"})
	require.NoError(t, err)
	f.await(replay.Job.ID)
	require.Equal(t, 2, h.count())
	h.mu.Lock()
	require.Equal(t, []string{d.ID.String(), d.ID.String()}, h.ids)
	h.mu.Unlock()
}

func TestRepeatedUnauthorizedRaisesAnAlertAndKeepsRetrying(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	// 401 three times, then the receiver's secret is fixed.
	ep, _ := f.register(statusServer(&h, func(n int) int {
		if n <= 3 {
			return http.StatusUnauthorized
		}
		return http.StatusNoContent
	}))
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{AuthAlertThreshold: 2, AuthSlowdown: 2})}))

	require.Equal(t, jobs.StateSucceeded, f.await(d.JobID).State, "401 is retried, not given up on")
	require.Equal(t, 4, h.count())
	events, err := f.outbox.ListByAggregate(t.Context(), f.pool, ep.ID)
	require.NoError(t, err)
	require.Len(t, events, 1, "one alert per run of failures, at the threshold")
	require.Equal(t, webhook.AlertAuthFailing, events[0].Type)
	var alert struct {
		Failures   int    `json:"consecutive_failures"`
		EndpointID string `json:"endpoint_id"`
	}
	require.NoError(t, json.Unmarshal(events[0].Payload, &alert))
	require.Equal(t, 2, alert.Failures)
	require.Equal(t, ep.ID.String(), alert.EndpointID)
	// The slower schedule: 2 x 20ms between the 401s.
	require.GreaterOrEqual(t, h.at(1).Sub(h.at(0)), 40*time.Millisecond)

	got, err := f.store.Endpoint(t.Context(), f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Zero(t, got.AuthFailures, "a success clears the count")
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 4)
	require.Equal(t, webhook.ClassAuth, attempts[0].ErrorClass)
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	f.register(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.add(r) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))

	require.Equal(t, jobs.StateSucceeded, f.await(d.JobID).State)
	require.Equal(t, 2, h.count())
	require.GreaterOrEqual(t, h.at(1).Sub(h.at(0)), time.Second, "the schedule says 20ms; Retry-After says 1s")
	attempts := f.attempts(d.ID)
	require.Equal(t, http.StatusTooManyRequests, attempts[0].Status)
	require.Equal(t, "delivered", attempts[1].Outcome)
	require.NotEqual(t, attempts[0].RequestHeaders["Webhook-Timestamp"], attempts[1].RequestHeaders["Webhook-Timestamp"])
	require.NotEqual(t, attempts[0].RequestHeaders["Webhook-Signature"], attempts[1].RequestHeaders["Webhook-Signature"],
		"a fresh timestamp and signature per attempt")
}

func TestRetriableFailuresExhaustToDeadLetterWithHistory(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, 10*time.Millisecond, 10*time.Millisecond)
	var h hits
	f.register(statusServer(&h, func(n int) int {
		return []int{http.StatusInternalServerError, http.StatusRequestTimeout, http.StatusFound}[n-1]
	}))
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))

	job := f.await(d.JobID)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Equal(t, 3, job.Attempt, "one attempt per schedule step")
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 3)
	for i, want := range []int{500, 408, 302} {
		a := attempts[i]
		require.Equal(t, want, a.Status)
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, d.ID.String(), a.RequestHeaders["Webhook-Id"], "the delivery id is stable across retries")
		require.Positive(t, a.Latency)
		require.Equal(t, strconv.FormatInt(a.StartedAt.Unix(), 10), a.RequestHeaders["Webhook-Timestamp"], "signed when sent")
	}
}

func TestConnectionErrorsAreRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, 10*time.Millisecond)
	// A port nothing listens on: the connection is refused.
	ep, _, err := f.store.RegisterEndpoint(t.Context(), f.pool, webhook.EndpointParams{
		Tenant: tenant, URL: "http://127.0.0.1:" + strconv.Itoa(closedPort(t)) + "/", EventTypes: []string{webhook.AllEvents},
	})
	require.NoError(t, err)
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))
	require.Equal(t, jobs.StateFailedTerminal, f.await(d.JobID).State)
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, webhook.ClassNetwork, attempts[0].ErrorClass)
	require.Zero(t, attempts[0].Status)
	got, err := f.store.Endpoint(t.Context(), f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Equal(t, 2, got.BreakerFails)
}

func closedPort(t *testing.T) int {
	t.Helper()
	ln := listenRecorder(t, "127.0.0.1:0")
	port, err := strconv.Atoi(ln.port())
	require.NoError(t, err)
	require.NoError(t, ln.ln.Close())
	return port
}

func TestAttemptTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, 10*time.Millisecond)
	var h hits
	release := make(chan struct{})
	f.register(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: only then does the server notice the client
		// hanging up and cancel r.Context().
		_, _ = io.Copy(io.Discard, r.Body)
		if h.add(r) == 1 {
			select { // hang until the client gives up
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { close(release) }) // runs before the server's Close
	client, err := webhook.NewClient(webhook.ClientConfig{AllowHTTP: true, Allow: loopback, AttemptTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{Client: client})}))
	require.Equal(t, jobs.StateSucceeded, f.await(d.JobID).State)
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, webhook.ClassNetwork, attempts[0].ErrorClass)
	require.GreaterOrEqual(t, attempts[0].Latency, 200*time.Millisecond)
	require.Less(t, attempts[0].Latency, 2*time.Second, "the per-attempt timeout fired")
}

func TestForbiddenOrDisabledEndpointsFailWithoutSending(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	ep, _ := f.register(statusServer(&h, always(http.StatusNoContent)))
	// A dispatcher whose client has no allow-list: the endpoint resolves to
	// loopback, which it refuses.
	strict, err := webhook.NewClient(webhook.ClientConfig{AllowHTTP: true})
	require.NoError(t, err)
	d := f.enqueue(webhook.Event{})[0]
	stop := f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{Client: strict})}))
	job := f.await(d.JobID)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Contains(t, job.LastError, "forbidden address")
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, webhook.ClassForbidden, attempts[0].ErrorClass)
	stop()

	// Disabled after the delivery was enqueued: it fails when it comes up.
	d = f.enqueue(webhook.Event{})[0]
	_, err = f.store.DisableEndpoint(t.Context(), f.pool, tenant, ep.ID, "tenant asked")
	require.NoError(t, err)
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))
	job = f.await(d.JobID)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Contains(t, job.LastError, webhook.ErrEndpointDisabled.Error())
	require.Zero(t, h.count(), "nothing was ever sent")

	// Re-enabled: new deliveries flow again.
	_, err = f.store.EnableEndpoint(t.Context(), f.pool, tenant, ep.ID)
	require.NoError(t, err)
	d = f.enqueue(webhook.Event{})[0]
	require.Equal(t, jobs.StateSucceeded, f.await(d.JobID).State)
	require.Equal(t, 1, h.count())
}

// One endpoint's deliveries arrive in the order they were enqueued, even
// when the first needs retries.
func TestEndpointDeliveriesKeepTheirOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var h hits
	f.register(statusServer(&h, func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	}))
	var want []string
	var last uuid.UUID
	for i := range 4 {
		d := f.enqueue(webhook.Event{ID: "evt-" + strconv.Itoa(i)})[0]
		want = append(want, d.ID.String())
		last = d.JobID
	}
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))
	require.Equal(t, jobs.StateSucceeded, f.await(last).State)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, append([]string{want[0], want[0]}, want...), h.ids)
}

// An attempt cut short by the runner shutting down says nothing about the
// endpoint: it is recorded, and the breaker is untouched.
func TestShutdownMidRequestDoesNotCountAgainstTheEndpoint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	arrived := make(chan struct{}, 1)
	ep, _ := f.register(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done() // hang until the sender hangs up
	}))
	d := f.enqueue(webhook.Event{})[0]
	cfg := runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})})
	cfg.ShutdownGrace = 50 * time.Millisecond
	stop := f.start(cfg)
	<-arrived
	stop()

	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, webhook.ClassInterrupted, attempts[0].ErrorClass)
	got, err := f.store.Endpoint(t.Context(), f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Zero(t, got.BreakerFails)
	job, err := f.jobs.Get(t.Context(), f.pool, tenant, d.JobID)
	require.NoError(t, err)
	require.False(t, job.State.Terminal(), "released for another runner")
}
