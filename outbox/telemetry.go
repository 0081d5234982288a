package outbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/telemetry"
)

// relayInstruments are a relay's metrics and tracer, created once by
// NewRelay.
type relayInstruments struct {
	tracing    bool // a TracerProvider was given: spans are worth extracting headers for
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	meter      metric.Meter

	events          metric.Int64Counter     // llmq.outbox.events
	publishDuration metric.Float64Histogram // llmq.outbox.publish.duration
	pending         metric.Int64ObservableGauge
	lag             metric.Float64ObservableGauge
	active          metric.Int64ObservableGauge // llmq.outbox.relay.active

	published, failed attribute.Set
}

func newRelayInstruments(cfg RelayConfig) (*relayInstruments, error) {
	m := telemetry.Meter(cfg.MeterProvider, "outbox")
	in := &relayInstruments{
		tracing:    cfg.TracerProvider != nil,
		tracer:     telemetry.Tracer(cfg.TracerProvider, "outbox"),
		propagator: telemetry.Propagator(cfg.Propagator),
		meter:      m,
		published:  attribute.NewSet(attribute.String("result", "published")),
		failed:     attribute.NewSet(attribute.String("result", "failed")),
	}
	var err error
	if in.events, err = m.Int64Counter("llmq.outbox.events", metric.WithUnit("{event}"),
		metric.WithDescription("Events the relay handed to the broker, by result: published (confirmed) or failed.")); err != nil {
		return nil, err
	}
	if in.publishDuration, err = m.Float64Histogram("llmq.outbox.publish.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of one batch's publication until the broker confirmed it."),
		metric.WithExplicitBucketBoundaries(telemetry.FastBuckets...)); err != nil {
		return nil, err
	}
	if in.pending, err = m.Int64ObservableGauge("llmq.outbox.pending", metric.WithUnit("{event}"),
		metric.WithDescription("Unpublished events.")); err != nil {
		return nil, err
	}
	if in.lag, err = m.Float64ObservableGauge("llmq.outbox.lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished event: the publication lag.")); err != nil {
		return nil, err
	}
	in.active, err = m.Int64ObservableGauge("llmq.outbox.relay.active", metric.WithUnit("{relay}"),
		metric.WithDescription("1 while this relay holds the leader lease and publishes, 0 while it stands by."))
	return in, err
}

// registerActiveGauge reports whether this relay is the active one, from
// memory.
func (r *Relay) registerActiveGauge() (metric.Registration, error) {
	return r.obs.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var v int64
		if r.active.Load() {
			v = 1
		}
		o.ObserveInt64(r.obs.active, v)
		return nil
	}, r.obs.active)
}

// registerGauges reports the backlog from Stats, read at most once per
// refresh.
func (r *Relay) registerGauges() (metric.Registration, error) {
	obs := r.obs
	snap := telemetry.NewSnapshot(r.cfg.GaugeRefresh, r.Stats)
	return obs.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := snap.Get(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(obs.pending, st.Pending)
		o.ObserveFloat64(obs.lag, st.OldestPending.Seconds())
		return nil
	}, obs.pending, obs.lag)
}

// startPublishSpans starts a producer span for each message whose event
// carries a trace context, and puts the span's own context in the message's
// headers in its place, so that consumers continue the trace through it.
// Events written outside a trace get no span: a trace of one relay hop
// would tell nothing.
func (r *Relay) startPublishSpans(ctx context.Context, msgs []broker.Message, recs []Record) []trace.Span {
	if !r.obs.tracing {
		return nil
	}
	spans := make([]trace.Span, len(msgs))
	for i := range msgs {
		parent := r.obs.propagator.Extract(ctx, propagation.MapCarrier(msgs[i].Headers))
		if !trace.SpanContextFromContext(parent).IsValid() {
			continue
		}
		spanCtx, span := r.obs.tracer.Start(parent, "publish "+msgs[i].Topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.operation.type", "publish"),
				attribute.String("messaging.destination.name", msgs[i].Topic),
				attribute.String("messaging.message.id", msgs[i].ID),
				attribute.String("llmq.outbox.event_type", recs[i].Type),
				attribute.Int("llmq.outbox.attempts", recs[i].Attempts)))
		r.obs.propagator.Inject(spanCtx, propagation.MapCarrier(msgs[i].Headers))
		spans[i] = span
	}
	return spans
}

// endPublishSpans ends the spans with each message's verdict.
func endPublishSpans(spans []trace.Span, failures []error) {
	for i, span := range spans {
		if span == nil {
			continue
		}
		if failures[i] != nil {
			span.SetStatus(codes.Error, failures[i].Error())
		}
		span.End()
	}
}
