package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// A run reports each attempt's recorded outcome with its error class, and
// each finished job's life from acceptance to its terminal state.
func TestRunnerMetrics(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := telemetrytest.NewMetrics(t)
	var flaky sync.Once
	cfg := fastConfig(map[string]lease.Handler{
		"ok": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }),
		"flaky": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			var err error
			flaky.Do(func() { err = errors.New("connection reset") })
			return json.RawMessage(`{}`), err
		}),
		"bad": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.Permanent(errors.New("unreadable document"))
		}),
	})
	cfg.MeterProvider = m.Provider
	f.start(cfg)
	ids := []*jobs.Job{
		f.enqueue(jobs.EnqueueParams{Kind: "ok", Payload: json.RawMessage(`{}`)}),
		f.enqueue(jobs.EnqueueParams{Kind: "flaky", Payload: json.RawMessage(`{}`)}),
		f.enqueue(jobs.EnqueueParams{Kind: "bad", Payload: json.RawMessage(`{}`)}),
	}
	for _, j := range ids {
		f.await(j.ID)
	}

	outcome := func(r telemetrytest.Reading, kind, outcome, class string) int64 {
		n, _ := r.Int("llmq.attempts", attribute.String("queue", "default"), attribute.String("kind", kind),
			attribute.String("outcome", outcome), attribute.String("error_class", class))
		return n
	}
	// The metrics follow the commit the await saw: wait for them.
	var r telemetrytest.Reading
	require.Eventually(t, func() bool {
		r = m.Collect(t)
		n, _ := r.Histogram("llmq.job.duration")
		return n == 3
	}, 5*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, outcome(r, "ok", "succeeded", ""))
	require.EqualValues(t, 1, outcome(r, "flaky", "retry_scheduled", jobs.ClassTransient))
	require.EqualValues(t, 1, outcome(r, "flaky", "succeeded", ""))
	require.EqualValues(t, 1, outcome(r, "bad", "failed", jobs.ClassPermanent))

	n, sum := r.Histogram("llmq.job.duration", attribute.String("state", "SUCCEEDED"))
	require.EqualValues(t, 2, n)
	require.Positive(t, sum)
	n, _ = r.Histogram("llmq.job.duration", attribute.String("kind", "bad"), attribute.String("state", "FAILED_TERMINAL"))
	require.EqualValues(t, 1, n)
	n, _ = r.Histogram("llmq.attempt.duration", attribute.String("kind", "flaky"))
	require.EqualValues(t, 2, n)
	n, _ = r.Histogram("llmq.claim.duration", attribute.String("queue", "default"))
	require.Positive(t, n)
	n, _ = r.Histogram("llmq.complete.duration")
	require.Positive(t, n)
	claimed, _ := r.Int("llmq.claimed", attribute.String("queue", "default"))
	require.EqualValues(t, 4, claimed)
	// The store's queue gauges are registered while the runner runs.
	_, ok := r.Int("llmq.jobs", attribute.String("queue", "default"), attribute.String("state", "runnable"))
	require.True(t, ok)
}

// A runner told to leave the queue gauges to another process reports its
// own metrics only.
func TestRunnerWithoutQueueGauges(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := telemetrytest.NewMetrics(t)
	cfg := fastConfig(map[string]lease.Handler{
		"ok": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }),
	})
	cfg.MeterProvider, cfg.NoQueueGauges = m.Provider, true
	f.start(cfg)
	f.await(f.enqueue(jobs.EnqueueParams{Kind: "ok", Payload: json.RawMessage(`{}`)}).ID)
	require.Eventually(t, func() bool {
		n, _ := m.Collect(t).Int("llmq.attempts")
		return n == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.NotContains(t, m.Collect(t).Names(), "llmq.jobs")
}

// An attempt's span continues the trace of the span that accepted its job,
// carries the attempt's identity and outcome, and is the span the handler's
// context holds.
func TestAttemptSpanContinuesAcceptanceTrace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tr := telemetrytest.NewTraces(t)
	inHandler := make(chan trace.SpanContext, 1)
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
			inHandler <- trace.SpanContextFromContext(ctx)
			return json.RawMessage(`{}`), nil
		}),
	})
	cfg.TracerProvider = tr.Provider
	f.start(cfg)

	ctx, accept := tr.Provider.Tracer("test").Start(t.Context(), "POST /invoices")
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	accept.End()
	f.await(res.Job.ID)

	require.Eventually(t, func() bool { return len(tr.Ended("llmq.attempt k")) == 1 }, 5*time.Second, 10*time.Millisecond)
	span := tr.Ended("llmq.attempt k")[0]
	require.Equal(t, accept.SpanContext().TraceID(), span.SpanContext().TraceID(), "same trace as the acceptance")
	require.Equal(t, accept.SpanContext().SpanID(), span.Parent().SpanID(), "child of the acceptance span")
	require.Equal(t, span.SpanContext(), <-inHandler, "the handler runs in the attempt's span")
	for key, want := range map[attribute.Key]attribute.Value{
		"llmq.job.id":          attribute.StringValue(res.Job.ID.String()),
		"llmq.job.attempt":     attribute.IntValue(1),
		"llmq.job.fence":       attribute.Int64Value(1),
		"llmq.job.kind":        attribute.StringValue("k"),
		"llmq.job.queue":       attribute.StringValue("default"),
		"llmq.attempt.outcome": attribute.StringValue("succeeded"),
	} {
		got, ok := telemetrytest.Attr(span, key)
		require.True(t, ok, key)
		require.Equal(t, want, got, key)
	}
	// The completion's event carries the acceptance's trace context too.
	var header string
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT headers->>'traceparent' FROM "+dbtest.OutboxEvents(f.schema, "o")+
		" WHERE aggregate_id = $1 AND event_type = 'k.completed'", res.Job.ID).Scan(&header))
	require.Equal(t, res.Job.TraceParent, header)
	require.NotEmpty(t, header)
}

// OnSucceeded runs in its job's trace: what it enqueues or writes joins the
// trace the job was accepted in.
func TestOnSucceededRunsInTheJobsTrace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tr := telemetrytest.NewTraces(t)
	inHook := make(chan trace.SpanContext, 1)
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }),
	})
	cfg.TracerProvider = tr.Provider
	cfg.OnSucceeded = func(ctx context.Context, _ pgx.Tx, _ *jobs.Job) error {
		inHook <- trace.SpanContextFromContext(ctx)
		return nil
	}
	f.start(cfg)

	ctx, accept := tr.Provider.Tracer("test").Start(t.Context(), "accept")
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	accept.End()
	require.Equal(t, jobs.StateSucceeded, f.await(res.Job.ID).State)
	require.Equal(t, accept.SpanContext().TraceID(), (<-inHook).TraceID())
}

// jsonLines decodes the JSON log lines of a slog JSON handler's output.
func jsonLines(logs *telemetrytest.LogBuffer) []map[string]any {
	var out []map[string]any
	for line := range strings.Lines(logs.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Every log line about an attempt, the handler's own through lease.Logger
// and the runner's, carries the job, tenant, attempt and fence.
func TestAttemptLogLinesCarryTheJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var buf telemetrytest.LogBuffer
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
			lease.Logger(ctx).Info("calling the provider")
			return json.RawMessage(`{}`), nil
		}),
	})
	cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.start(cfg)
	job := f.enqueue(jobs.EnqueueParams{Kind: "k", Payload: json.RawMessage(`{}`)})
	f.await(job.ID)

	byMsg := map[string]map[string]any{}
	require.Eventually(t, func() bool {
		for _, l := range jsonLines(&buf) {
			if msg, ok := l["msg"].(string); ok {
				byMsg[msg] = l
			}
		}
		return byMsg["llmq: attempt recorded"] != nil
	}, 5*time.Second, 10*time.Millisecond)
	for _, msg := range []string{"calling the provider", "llmq: attempt recorded"} {
		l := byMsg[msg]
		require.NotNil(t, l, msg)
		require.Equal(t, job.ID.String(), l["job"], msg)
		require.Equal(t, "acme", l["tenant"], msg)
		require.EqualValues(t, 1, l["attempt"], msg)
		require.EqualValues(t, 1, l["fence"], msg)
	}
	require.NotNil(t, lease.Logger(context.Background()), "outside an attempt a discarding logger")
}

// The time attempts wait for an admission permit is recorded by pool and
// result: with one request a second, the second of two jobs waits about a
// second for its grant.
func TestAdmissionWaitsRecorded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := telemetrytest.NewMetrics(t)
	limiter, err := admission.NewLocal(admission.Pool{Name: "p", RPM: 60, TPM: 1_000_000, MaxInFlight: 10, RequestBurst: 1})
	require.NoError(t, err)
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }),
	})
	cfg.MeterProvider = m.Provider
	cfg.Admission = &lease.Admission{
		Limiter: limiter,
		Route: func(j *jobs.Job) (admission.Request, bool) {
			return admission.Request{Pool: "p", Tenant: j.Tenant, Tokens: 1}, true
		},
		MaxWait: 1500 * time.Millisecond,
	}
	f.start(cfg)
	a := f.enqueue(jobs.EnqueueParams{Kind: "k", Payload: json.RawMessage(`{}`)})
	b := f.enqueue(jobs.EnqueueParams{Kind: "k", Payload: json.RawMessage(`{}`)})
	require.Equal(t, jobs.StateSucceeded, f.await(a.ID).State)
	require.Equal(t, jobs.StateSucceeded, f.await(b.ID).State)

	var n uint64
	var sum float64
	require.Eventually(t, func() bool {
		n, sum = m.Collect(t).Histogram("llmq.admission.wait", attribute.String("pool", "p"), attribute.String("result", "granted"))
		return n == 2
	}, 5*time.Second, 10*time.Millisecond)
	require.Greater(t, sum, 0.5, "one attempt waited for the bucket to refill")
}
