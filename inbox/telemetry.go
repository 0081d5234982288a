package inbox

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

// What became of a delivery, as llmq.inbox.messages counts it.
const (
	resultAccepted    = "accepted"    // new: handled and committed
	resultDuplicate   = "duplicate"   // already recorded: acknowledged, not handled again
	resultQuarantined = "quarantined" // no id, malformed, or an id reused with another payload
	resultFailed      = "failed"      // rolled back and nacked: the broker redelivers it
	resultSkipped     = "skipped"     // a tombstone acknowledged unhandled (SkipTombstones)
)

// ingressInstruments are an ingress's metrics and tracer, created once by
// NewIngress.
type ingressInstruments struct {
	tracing    bool
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	messages   metric.Int64Counter // llmq.inbox.messages
	results    map[string]attribute.Set
}

func newIngressInstruments(cfg IngressConfig) (*ingressInstruments, error) {
	m := telemetry.Meter(cfg.MeterProvider, "inbox")
	messages, err := m.Int64Counter("llmq.inbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries the ingress settled, by consumer and result: accepted, duplicate, quarantined, failed (redelivered) or skipped (tombstones)."))
	if err != nil {
		return nil, err
	}
	in := &ingressInstruments{
		tracing:    cfg.TracerProvider != nil,
		tracer:     telemetry.Tracer(cfg.TracerProvider, "inbox"),
		propagator: telemetry.Propagator(cfg.Propagator),
		messages:   messages,
		results:    map[string]attribute.Set{},
	}
	for _, r := range []string{resultAccepted, resultDuplicate, resultQuarantined, resultFailed, resultSkipped} {
		in.results[r] = attribute.NewSet(attribute.String("consumer", cfg.Consumer), attribute.String("result", r))
	}
	return in, nil
}

// startSpans starts a consumer span per delivery, continuing the trace its
// headers carry (a new trace when they carry none); nil without a
// TracerProvider.
func (in *Ingress) startSpans(ctx context.Context, batch []broker.Delivery) []trace.Span {
	if !in.obs.tracing {
		return nil
	}
	spans := make([]trace.Span, len(batch))
	for i, d := range batch {
		msg := d.Message()
		parent := in.obs.propagator.Extract(ctx, propagation.MapCarrier(msg.Headers))
		_, spans[i] = in.obs.tracer.Start(parent, "process "+msg.Topic,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("messaging.operation.type", "process"),
				attribute.String("messaging.destination.name", msg.Topic),
				attribute.String("messaging.message.id", msg.ID),
				attribute.String("messaging.consumer.group.name", in.cfg.Consumer)))
	}
	return spans
}

// inSpan is ctx with the i-th delivery's span, for its handler.
func inSpan(ctx context.Context, spans []trace.Span, i int) context.Context {
	if spans == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, spans[i])
}

// report counts each settled delivery and ends its span.
func (in *Ingress) report(ctx context.Context, results []string, errs []error, spans []trace.Span) {
	counting := in.obs.messages.Enabled(ctx)
	for i, r := range results {
		if counting {
			in.obs.messages.Add(ctx, 1, metric.WithAttributeSet(in.obs.results[r]))
		}
		if spans == nil {
			continue
		}
		spans[i].SetAttributes(attribute.String("llmq.inbox.result", r))
		if errs[i] != nil {
			spans[i].SetStatus(codes.Error, errs[i].Error())
		}
		spans[i].End()
	}
}
