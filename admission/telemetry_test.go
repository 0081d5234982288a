package admission_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
)

// The Postgres limiter counts grants, denials by reason and cooldowns, and
// the tokens reserved against those providers reported used; a pool it
// does not know never becomes a label.
func TestLimiterMetrics(t *testing.T) {
	t.Parallel()
	m := telemetrytest.NewMetrics(t)
	f := setup(t, admission.Config{MeterProvider: m.Provider})
	ctx := t.Context()
	p := slow("gpt")
	p.MaxInFlight = 1
	require.NoError(t, f.pg.SetPool(ctx, p))

	permit, err := f.pg.Acquire(ctx, admission.Request{Pool: "gpt", Tenant: "acme", Tokens: 300})
	require.NoError(t, err)
	_, err = f.pg.Acquire(ctx, admission.Request{Pool: "gpt", Tenant: "acme", Tokens: 300})
	var wait *admission.WaitError
	require.ErrorAs(t, err, &wait)
	require.Equal(t, admission.ReasonInFlight, wait.Reason)
	require.NoError(t, permit.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 120, OutputTokens: 80}))
	require.NoError(t, f.pg.Cooldown(ctx, "gpt", time.Minute))
	_, err = f.pg.Acquire(ctx, admission.Request{Pool: "gpt", Tokens: 1})
	require.ErrorAs(t, err, &wait)
	require.Equal(t, admission.ReasonCooldown, wait.Reason)
	_, err = f.pg.Acquire(ctx, admission.Request{Pool: "no-such-pool", Tokens: 1})
	require.ErrorIs(t, err, admission.ErrUnknownPool)

	r := m.Collect(t)
	gpt := attribute.String("pool", "gpt")
	for _, c := range []struct {
		attrs []attribute.KeyValue
		want  int64
	}{
		{[]attribute.KeyValue{gpt, attribute.String("result", "granted")}, 1},
		{[]attribute.KeyValue{gpt, attribute.String("result", "denied"), attribute.String("reason", "in_flight")}, 1},
		{[]attribute.KeyValue{gpt, attribute.String("result", "denied"), attribute.String("reason", "cooldown")}, 1},
		{[]attribute.KeyValue{attribute.String("result", "error")}, 1},
	} {
		got, _ := r.Int("llmq.admission.acquires", c.attrs...)
		require.Equal(t, c.want, got, "%v", c.attrs)
	}
	for _, set := range r.Attributes("llmq.admission.acquires") {
		v, _ := set.Value("pool")
		require.NotEqual(t, "no-such-pool", v.AsString(), "an unknown pool is no label")
	}
	cooldowns, _ := r.Int("llmq.admission.cooldowns", gpt)
	require.EqualValues(t, 1, cooldowns)
	reserved, _ := r.Int("llmq.admission.tokens.reserved", gpt)
	require.EqualValues(t, 300, reserved)
	used, _ := r.Int("llmq.admission.tokens.used", gpt)
	require.EqualValues(t, 200, used)
}
