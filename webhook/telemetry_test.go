package webhook_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// Each delivery attempt is counted by outcome and class and timed, and is a
// span under the runner's attempt span with the endpoint's status; the
// breaker gauge counts the endpoint as closed.
func TestDeliveryMetricsAndSpans(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := telemetrytest.NewMetrics(t)
	tr := telemetrytest.NewTraces(t)
	var h hits
	f.register(statusServer(&h, func(n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	}))
	d := f.enqueue(webhook.Event{})[0]
	dispatcher := f.dispatcher(webhook.DispatcherConfig{MeterProvider: m.Provider, TracerProvider: tr.Provider})
	t.Cleanup(func() { require.NoError(t, dispatcher.Close()) })
	cfg := runnerConfig(map[string]lease.Handler{webhook.Kind: dispatcher})
	cfg.TracerProvider = tr.Provider
	f.start(cfg)
	require.Equal(t, jobs.StateSucceeded, f.await(d.JobID).State)

	r := m.Collect(t)
	retried, _ := r.Int("llmq.webhook.attempts", attribute.String("outcome", "retry"), attribute.String("class", webhook.ClassHTTP))
	require.EqualValues(t, 1, retried)
	delivered, _ := r.Int("llmq.webhook.attempts", attribute.String("outcome", "delivered"))
	require.EqualValues(t, 1, delivered)
	n, _ := r.Histogram("llmq.webhook.attempt.duration")
	require.EqualValues(t, 2, n)
	closed, ok := r.Int("llmq.webhook.breakers", attribute.String("state", "closed"))
	require.True(t, ok)
	require.EqualValues(t, 1, closed)

	require.Eventually(t, func() bool { return len(tr.Ended("llmq.attempt "+webhook.Kind)) == 2 }, 5*time.Second, 10*time.Millisecond)
	spans := tr.Ended("webhook deliver")
	require.Len(t, spans, 2)
	attempts := tr.Ended("llmq.attempt " + webhook.Kind)
	for i, want := range []int64{http.StatusServiceUnavailable, http.StatusNoContent} {
		status, ok := telemetrytest.Attr(spans[i], "http.response.status_code")
		require.True(t, ok)
		require.Equal(t, want, status.AsInt64())
		require.Equal(t, attempts[i].SpanContext().SpanID(), spans[i].Parent().SpanID(), "a child of the runner's attempt span")
		id, _ := telemetrytest.Attr(spans[i], "llmq.webhook.delivery_id")
		require.Equal(t, d.ID.String(), id.AsString())
	}
}

// The receiver counts every delivery by the status it answered: a signed
// new delivery 204, its redelivery 200, an unsigned one 400.
func TestReceiverCountsByStatus(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := telemetrytest.NewMetrics(t)
	key := webhook.Key{ID: "erp", Secret: webhook.NewSecret()}
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}})
	require.NoError(t, err)
	rc, err := webhook.NewReceiver(webhook.ReceiverConfig{
		Verifier: v, Inbox: f.inbox, DB: f.pool, Consumer: "erp", MeterProvider: m.Provider,
		Handle: func(context.Context, pgx.Tx, webhook.Received) error { return nil },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	post := func(header http.Header) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(`{"a":1}`))
		require.NoError(t, err)
		maps.Copy(req.Header, header)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	signed := webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, "d1", time.Now(), []byte(`{"a":1}`), false)
	require.Equal(t, http.StatusNoContent, post(signed))
	require.Equal(t, http.StatusOK, post(signed))
	require.Equal(t, http.StatusBadRequest, post(http.Header{}))

	r := m.Collect(t)
	for status, want := range map[int]int64{http.StatusNoContent: 1, http.StatusOK: 1, http.StatusBadRequest: 1} {
		got, _ := r.Int("llmq.webhook.received", attribute.Int("status", status))
		require.Equal(t, want, got, status)
	}
}
