package webhook

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/jobs"
)

// DefaultGaugeRefresh is how long the breaker gauge reuses one reading.
const DefaultGaugeRefresh = 15 * time.Second

// dispatcherInstruments are a dispatcher's metrics and tracer, created once
// by NewDispatcher.
type dispatcherInstruments struct {
	tracer   trace.Tracer
	attempts metric.Int64Counter     // llmq.webhook.attempts
	duration metric.Float64Histogram // llmq.webhook.attempt.duration
	breakers metric.Int64ObservableGauge
	reg      metric.Registration // the breaker gauge's callback; nil without a MeterProvider
}

// withConn runs a function that uses one database connection within the
// dispatcher's budget.
type withConn func(context.Context, func() error) error

func (s *Store) newDispatcherInstruments(conn withConn, db DBTX, cfg DispatcherConfig) (*dispatcherInstruments, error) {
	m := telemetry.Meter(cfg.MeterProvider, "webhook")
	in := &dispatcherInstruments{tracer: telemetry.Tracer(cfg.TracerProvider, "webhook")}
	var err error
	if in.attempts, err = m.Int64Counter("llmq.webhook.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Delivery attempts by outcome (delivered, retry, failed, disabled, deferred) and error class.")); err != nil {
		return nil, err
	}
	if in.duration, err = m.Float64Histogram("llmq.webhook.attempt.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from sending a delivery to the endpoint's answer (or the failure), by outcome."),
		metric.WithExplicitBucketBoundaries(telemetry.FastBuckets...)); err != nil {
		return nil, err
	}
	if in.breakers, err = m.Int64ObservableGauge("llmq.webhook.breakers", metric.WithUnit("{endpoint}"),
		metric.WithDescription("Enabled endpoints by circuit-breaker state (closed, open, half_open).")); err != nil {
		return nil, err
	}
	if cfg.MeterProvider == nil {
		return in, nil
	}
	snap := telemetry.NewSnapshot(cfg.GaugeRefresh, func(ctx context.Context) (map[BreakerState]int64, error) {
		var states map[BreakerState]int64
		err := conn(ctx, func() error {
			var err error
			states, err = s.breakerStates(ctx, db)
			return err
		})
		return states, err
	})
	in.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		states, err := snap.Get(ctx)
		if err != nil {
			return err
		}
		for _, st := range []BreakerState{BreakerClosed, BreakerOpen, BreakerHalfOpen} {
			o.ObserveInt64(in.breakers, states[st], metric.WithAttributes(attribute.String("state", string(st))))
		}
		return nil
	}, in.breakers)
	return in, err
}

// breakerStates counts enabled endpoints by breaker state.
func (s *Store) breakerStates(ctx context.Context, db DBTX) (map[BreakerState]int64, error) {
	rows, err := db.Query(ctx, s.sql.breakerStates)
	if err != nil {
		return nil, fmt.Errorf("webhook: breaker states: %w", err)
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		state string
		n     int64
	}, error) {
		var r struct {
			state string
			n     int64
		}
		return r, row.Scan(&r.state, &r.n)
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: breaker states: %w", err)
	}
	out := make(map[BreakerState]int64, len(counts))
	for _, c := range counts {
		out[BreakerState(c.state)] = c.n
	}
	return out, nil
}

// Close stops the breaker gauge's reports. The dispatcher itself needs no
// closing; call Close when a MeterProvider outlives it.
func (d *Dispatcher) Close() error {
	if d.obs.reg == nil {
		return nil
	}
	return d.obs.reg.Unregister()
}

// startSpan starts the span of one delivery attempt, a child of the
// runner's attempt span in ctx.
func (d *Dispatcher) startSpan(ctx context.Context, job *jobs.Job, p deliveryPayload) (context.Context, trace.Span) {
	if d.cfg.TracerProvider == nil {
		// A no-op span, never the runner's from ctx, which report would end.
		return ctx, trace.SpanFromContext(context.Background())
	}
	return d.obs.tracer.Start(ctx, "webhook deliver", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", "POST"),
			attribute.String("llmq.webhook.delivery_id", p.DeliveryID.String()),
			attribute.String("llmq.webhook.endpoint_id", p.EndpointID.String()),
			attribute.Int("llmq.webhook.attempt", job.Attempt)))
}

// report counts one attempt and ends its span. latency is zero for an
// attempt that sent nothing (deferred by the breaker).
func (d *Dispatcher) report(ctx context.Context, span trace.Span, v verdict, resp *Response, latency time.Duration) {
	if resp != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", resp.Status))
	}
	span.SetAttributes(attribute.String("llmq.webhook.outcome", v.outcome))
	if v.class != "" {
		span.SetAttributes(attribute.String("error.type", v.class))
		span.SetStatus(codes.Error, v.message)
	}
	span.End()
	if d.obs.attempts.Enabled(ctx) {
		d.obs.attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", v.outcome), attribute.String("class", v.class)))
	}
	if latency > 0 && d.obs.duration.Enabled(ctx) {
		d.obs.duration.Record(ctx, latency.Seconds(), metric.WithAttributes(attribute.String("outcome", v.outcome)))
	}
}
