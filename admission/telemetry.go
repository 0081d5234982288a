package admission

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/internal/telemetry"
)

// limiterInstruments are a Postgres limiter's metrics, created once by
// NewPostgres.
type limiterInstruments struct {
	acquires       metric.Int64Counter // llmq.admission.acquires
	cooldowns      metric.Int64Counter // llmq.admission.cooldowns
	tokensReserved metric.Int64Counter // llmq.admission.tokens.reserved
	tokensUsed     metric.Int64Counter // llmq.admission.tokens.used
}

func newLimiterInstruments(mp metric.MeterProvider) (*limiterInstruments, error) {
	m := telemetry.Meter(mp, "admission")
	in := &limiterInstruments{}
	var err error
	if in.acquires, err = m.Int64Counter("llmq.admission.acquires", metric.WithUnit("{request}"),
		metric.WithDescription("Acquires by pool and result (granted, emergency, denied with its reason, never_admissible, unavailable, error).")); err != nil {
		return nil, err
	}
	if in.cooldowns, err = m.Int64Counter("llmq.admission.cooldowns", metric.WithUnit("{cooldown}"),
		metric.WithDescription("Cooldowns set on a pool after a provider asked to wait.")); err != nil {
		return nil, err
	}
	if in.tokensReserved, err = m.Int64Counter("llmq.admission.tokens.reserved", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens reserved by granted permits, by pool.")); err != nil {
		return nil, err
	}
	in.tokensUsed, err = m.Int64Counter("llmq.admission.tokens.used", metric.WithUnit("{token}"),
		metric.WithDescription("Tokens providers reported used, as permits were released, by pool."))
	return in, err
}

// acquired counts one Acquire. The pool is a label only once the limiter
// knows it: a caller's unknown or invalid pool name must not become a new
// series.
func (in *limiterInstruments) acquired(ctx context.Context, req Request, err error, emergency bool) {
	if !in.acquires.Enabled(ctx) {
		return
	}
	var wait *WaitError
	pool := attribute.String("pool", req.Pool)
	attrs := []attribute.KeyValue{pool, attribute.String("result", "granted")}
	switch {
	case err == nil && emergency:
		attrs[1] = attribute.String("result", "emergency")
	case err == nil:
	case errors.As(err, &wait):
		attrs = append(attrs[:1], attribute.String("result", "denied"), attribute.String("reason", string(wait.Reason)))
	case errors.Is(err, ErrNeverAdmissible):
		attrs[1] = attribute.String("result", "never_admissible")
	case errors.Is(err, ErrUnavailable):
		attrs[1] = attribute.String("result", "unavailable")
	default: // an unknown pool, invalid input, a database error
		attrs = []attribute.KeyValue{attribute.String("result", "error")}
	}
	in.acquires.Add(ctx, 1, metric.WithAttributes(attrs...))
	if err == nil && req.Tokens > 0 {
		in.tokensReserved.Add(ctx, req.Tokens, metric.WithAttributes(pool))
	}
}

func (in *limiterInstruments) released(ctx context.Context, p *Permit, o CallOutcome) {
	if used := o.used(); used > 0 && in.tokensUsed.Enabled(ctx) {
		in.tokensUsed.Add(ctx, used, metric.WithAttributes(attribute.String("pool", p.Pool)))
	}
}

func (in *limiterInstruments) cooled(ctx context.Context, pool string) {
	if in.cooldowns.Enabled(ctx) {
		in.cooldowns.Add(ctx, 1, metric.WithAttributes(attribute.String("pool", pool)))
	}
}
