package lease

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/jobs"
)

// instruments are the runner's metrics and tracer, created once by
// NewRunner. With no MeterProvider they are no-ops whose Enabled is false,
// and the runner skips building their attributes.
type instruments struct {
	tracer trace.Tracer

	attempts         metric.Int64Counter     // llmq.attempts
	attemptDuration  metric.Float64Histogram // llmq.attempt.duration
	claimDuration    metric.Float64Histogram // llmq.claim.duration
	claimed          metric.Int64Counter     // llmq.claimed
	completeDuration metric.Float64Histogram // llmq.complete.duration
	jobDuration      metric.Float64Histogram // llmq.job.duration
	reaped           metric.Int64Counter     // llmq.reaped
	admissionWait    metric.Float64Histogram // llmq.admission.wait
	hung             metric.Int64Counter     // llmq.attempts.hung
	routeCalls       metric.Int64Counter     // llmq.route.calls

	// Attribute sets by what they hold, built once each: sorting and
	// hashing a set on every measurement would cost more than recording it.
	// The label values are bounded, so the cache is too.
	mu   sync.RWMutex
	sets map[attrKey]metric.MeasurementOption
}

// attrKey names one attribute set of an attempt measurement; field names
// the instrument.
type attrKey struct{ field, queue, kind, outcome, class, state string }

func (in *instruments) attrs(k attrKey) metric.MeasurementOption {
	in.mu.RLock()
	o, ok := in.sets[k]
	in.mu.RUnlock()
	if ok {
		return o
	}
	kvs := []attribute.KeyValue{attribute.String("queue", k.queue), attribute.String("kind", k.kind)}
	switch k.field {
	case "attempts":
		kvs = append(kvs, attribute.String("outcome", k.outcome), attribute.String("error_class", k.class))
	case "attempt.duration":
		kvs = append(kvs, attribute.String("outcome", k.outcome))
	case "job.duration":
		kvs = append(kvs, attribute.String("state", k.state))
	case "hung":
	}
	o = metric.WithAttributeSet(attribute.NewSet(kvs...))
	in.mu.Lock()
	in.sets[k] = o
	in.mu.Unlock()
	return o
}

func newInstruments(cfg Config) (*instruments, error) {
	m := telemetry.Meter(cfg.MeterProvider, "lease")
	in := &instruments{tracer: telemetry.Tracer(cfg.TracerProvider, "lease"), sets: map[attrKey]metric.MeasurementOption{}}
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		if err != nil {
			return nil
		}
		var h metric.Float64Histogram
		h, err = m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		return h
	}
	in.attempts = counter("llmq.attempts", "{attempt}", "Attempts by queue, kind, recorded outcome and error class.")
	in.attemptDuration = histogram("llmq.attempt.duration", "Time a handler ran, by queue, kind and outcome.", telemetry.SlowBuckets)
	in.claimDuration = histogram("llmq.claim.duration", "Latency of one claim transaction, by queue.", telemetry.FastBuckets)
	in.claimed = counter("llmq.claimed", "{job}", "Jobs claimed, by queue.")
	in.completeDuration = histogram("llmq.complete.duration", "Latency of one completion transaction (a batch of outcomes).", telemetry.FastBuckets)
	in.jobDuration = histogram("llmq.job.duration", "From acceptance to a terminal state, by queue, kind and state.", telemetry.SlowBuckets)
	in.reaped = counter("llmq.reaped", "{job}", "Expired leases and deadlines the reaper acted on, by result.")
	in.hung = counter("llmq.attempts.hung", "{attempt}", "Attempts given up because their handler kept running past the timeout and grace, by queue and kind.")
	in.admissionWait = histogram("llmq.admission.wait", "Time an attempt waited for an admission permit, by pool and result.", telemetry.FastBuckets)
	in.routeCalls = counter("llmq.route.calls", "{call}", "Route candidates' part in attempts, by kind, candidate and result: served, failed[_<failure>], moved_<failure> (failed and moved on) or passed (no permit within the wait).")
	return in, err
}

// Span and log attribute keys of an attempt.
const (
	attrJobID   = attribute.Key("llmq.job.id")
	attrTenant  = attribute.Key("llmq.job.tenant")
	attrKind    = attribute.Key("llmq.job.kind")
	attrQueue   = attribute.Key("llmq.job.queue")
	attrAttempt = attribute.Key("llmq.job.attempt")
	attrFence   = attribute.Key("llmq.job.fence")
	attrOutcome = attribute.Key("llmq.attempt.outcome")
	attrState   = attribute.Key("llmq.job.state")
	attrClass   = attribute.Key("error.type")
)

// startAttempt starts the attempt's span, a child of the span that accepted
// the job when the job carries its trace context (jobs.Job.TraceParent), and
// puts the attempt's logger in ctx.
func (r *Runner) startAttempt(ctx context.Context, job *jobs.Job) (context.Context, trace.Span, *slog.Logger) {
	// Without a TracerProvider, a no-op span: never one ctx holds, which
	// endAttempt would end.
	span := trace.SpanFromContext(context.Background())
	if r.cfg.TracerProvider != nil {
		ctx, span = r.obs.tracer.Start(telemetry.RemoteContext(ctx, job.TraceParent), "llmq.attempt "+job.Kind,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attrJobID.String(job.ID.String()), attrTenant.String(job.Tenant), attrKind.String(job.Kind),
				attrQueue.String(job.Queue), attrAttempt.Int(job.Attempt), attrFence.Int64(job.Fence)))
	}
	logger := r.cfg.Logger
	if base := logger.Handler(); base != slog.DiscardHandler { // attributes nobody reads are not built
		logger = slog.New(&attemptHandler{base: base, job: job})
	}
	return context.WithValue(ctx, loggerKey{}, logger), span, logger
}

// attemptHandler adds an attempt's attributes (job, tenant, kind, attempt,
// fence) to its lines, built when the first line is written: most attempts
// write none, and building them cost more than the rest of an attempt's
// telemetry.
type attemptHandler struct {
	base slog.Handler
	job  *jobs.Job
	once sync.Once
	with slog.Handler
}

func (a *attemptHandler) handler() slog.Handler {
	a.once.Do(func() {
		j := a.job
		a.with = a.base.WithAttrs([]slog.Attr{
			slog.Any("job", j.ID), slog.String("tenant", j.Tenant), slog.String("kind", j.Kind),
			slog.Int("attempt", j.Attempt), slog.Int64("fence", j.Fence),
		})
	})
	return a.with
}

func (a *attemptHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return a.base.Enabled(ctx, l)
}

func (a *attemptHandler) Handle(ctx context.Context, r slog.Record) error {
	return a.handler().Handle(ctx, r)
}

func (a *attemptHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return a.handler().WithAttrs(attrs)
}

func (a *attemptHandler) WithGroup(name string) slog.Handler { return a.handler().WithGroup(name) }

// recordedOutcome names what the attempt's row says, as the completion
// recorded it.
func recordedOutcome(c jobs.Completion, res *jobs.CompletionResult, err error) string {
	if res == nil {
		if errors.Is(err, jobs.ErrLeaseLost) {
			return "stale"
		}
		return "unrecorded"
	}
	switch res.State {
	case jobs.StateSucceeded:
		if c.ReusedFrom != uuid.Nil {
			return string(jobs.AttemptReused)
		}
		return "succeeded"
	case jobs.StateReviewRequired:
		return "review_required"
	case jobs.StateCancelled:
		return "cancelled"
	case jobs.StateFailedTerminal:
		return "failed"
	}
	switch c.Outcome {
	case jobs.OutcomeReleased, jobs.OutcomeSnoozed:
		return string(c.Outcome)
	}
	return "retry_scheduled"
}

// endAttempt reports the recorded attempt: metrics, the span's outcome, and
// for a terminal job its life from acceptance to the end.
func (r *Runner) endAttempt(ctx context.Context, span trace.Span, job *jobs.Job, c jobs.Completion, ran time.Duration, res *jobs.CompletionResult, err error) {
	outcome := recordedOutcome(c, res, err)
	class := c.ErrorClass
	if res != nil && outcome != "succeeded" {
		class = res.ErrorClass // the store may decide otherwise: "deadline"
	}
	span.SetAttributes(attrOutcome.String(outcome))
	if res != nil {
		span.SetAttributes(attrState.String(string(res.State)))
	}
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case c.Error != "":
		span.SetAttributes(attrClass.String(class))
		span.SetStatus(codes.Error, c.Error)
	}
	span.End()

	if r.obs.attempts.Enabled(ctx) {
		r.obs.attempts.Add(ctx, 1, r.obs.attrs(attrKey{field: "attempts", queue: job.Queue, kind: job.Kind, outcome: outcome, class: class}))
	}
	if r.obs.attemptDuration.Enabled(ctx) {
		r.obs.attemptDuration.Record(ctx, ran.Seconds(), r.obs.attrs(attrKey{field: "attempt.duration", queue: job.Queue, kind: job.Kind, outcome: outcome}))
	}
	if res != nil && res.State.Terminal() && r.obs.jobDuration.Enabled(ctx) {
		r.obs.jobDuration.Record(ctx, res.FinishedAt.Sub(job.CreatedAt).Seconds(),
			r.obs.attrs(attrKey{field: "job.duration", queue: job.Queue, kind: job.Kind, state: string(res.State)}))
	}
}

// loggerKey finds the attempt's logger in its context.
type loggerKey struct{}

// Logger returns the logger of the attempt whose context ctx is (or derives
// from): Config.Logger with the attributes job, tenant, kind, attempt and
// fence, which every runner line about the attempt carries too. Outside an
// attempt it returns a logger that discards everything.
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.New(slog.DiscardHandler)
}
