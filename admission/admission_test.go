package admission_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
)

// limiter is what both implementations offer, so each contract test runs
// against both.
type limiter interface {
	admission.Limiter
	SetPool(ctx context.Context, p admission.Pool) error
	State(ctx context.Context, pool string) (admission.PoolState, error)
}

type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	pg     *admission.Postgres
}

func setup(t *testing.T, cfgs ...admission.Config) *fixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 10})
	var cfg admission.Config
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	cfg.Schema = db.Schema
	pg, err := admission.NewPostgres(db.Pool, cfg)
	require.NoError(t, err)
	return &fixture{t: t, pool: db.Pool, schema: db.Schema, pg: pg}
}

// limiters returns a Postgres and a Local limiter, both holding pools.
func (f *fixture) limiters(pools ...admission.Pool) map[string]limiter {
	f.t.Helper()
	local, err := admission.NewLocal()
	require.NoError(f.t, err)
	ls := map[string]limiter{"postgres": f.pg, "local": local}
	for _, l := range ls {
		for _, p := range pools {
			require.NoError(f.t, l.SetPool(f.t.Context(), p))
		}
	}
	return ls
}

// slow is a pool whose buckets refill so slowly (1 request a minute, 0.1
// tokens a second) that levels can be compared exactly, within 1 token.
func slow(name string) admission.Pool {
	return admission.Pool{Name: name, RPM: 1, TPM: 6, MaxInFlight: 3, RequestBurst: 10, TokenBurst: 1000}
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, tc := range []struct {
		name            string
		chargeReserved  bool
		refundUncertain bool
		outcome         admission.CallOutcome
		wantRequests    float64 // request level after release, from 10
		wantTokens      float64 // token level after release, from 1000 with 100 reserved
	}{
		{"never sent", false, false, admission.CallOutcome{Result: admission.CallNotSent}, 10, 1000},
		{"answered", false, false, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 20, OutputTokens: 10}, 9, 970},
		{"answered, provider counts max_tokens", true, false, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 20, OutputTokens: 10}, 9, 900},
		{"answered, more than reserved", false, false, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 100, OutputTokens: 50}, 9, 850},
		{"timed out", false, false, admission.CallOutcome{Result: admission.CallUncertain}, 9, 900},
		{"5xx", false, false, admission.CallOutcome{Result: admission.CallUncertain}, 9, 900},
		{"429", false, false, admission.CallOutcome{Result: admission.CallUncertain}, 9, 900},
		{"timed out, pool refunds uncertain calls", false, true, admission.CallOutcome{Result: admission.CallUncertain}, 9, 1000},
	} {
		pool := slow(fmt.Sprintf("refund-%d", len(tc.name)))
		pool.Name = "refund " + tc.name
		pool.ChargeReserved, pool.RefundUncertain = tc.chargeReserved, tc.refundUncertain
		for kind, l := range f.limiters(pool) {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				p, err := l.Acquire(ctx, admission.Request{Pool: pool.Name, Tenant: "acme", Tokens: 100})
				require.NoError(t, err)
				held, err := l.State(ctx, pool.Name)
				require.NoError(t, err)
				require.Equal(t, 1, held.InFlight)
				require.InDelta(t, 9, held.RequestLevel, 0.1)
				require.InDelta(t, 900, held.TokenLevel, 1)

				require.NoError(t, p.Release(ctx, tc.outcome))
				after, err := l.State(ctx, pool.Name)
				require.NoError(t, err)
				require.Zero(t, after.InFlight)
				require.InDelta(t, tc.wantRequests, after.RequestLevel, 0.1)
				require.InDelta(t, tc.wantTokens, after.TokenLevel, 1)

				require.ErrorIs(t, p.Release(ctx, tc.outcome), admission.ErrReleased)
				again, err := l.State(ctx, pool.Name)
				require.NoError(t, err)
				require.InDelta(t, after.TokenLevel, again.TokenLevel, 1, "a second release changes nothing")
			})
		}
	}
}

func TestAcquireAllOrNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pool := slow("tight")
	pool.MaxInFlight = 2
	pool.RequestBurst = 3
	for kind, l := range f.limiters(pool) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			req := admission.Request{Pool: "tight", Tokens: 400}
			p1, err := l.Acquire(ctx, req)
			require.NoError(t, err)
			_, err = l.Acquire(ctx, req)
			require.NoError(t, err)

			before, err := l.State(ctx, "tight")
			require.NoError(t, err)
			_, err = l.Acquire(ctx, admission.Request{Pool: "tight", Tokens: 10})
			var wait *admission.WaitError
			require.ErrorAs(t, err, &wait)
			require.Equal(t, admission.ReasonInFlight, wait.Reason)
			require.Positive(t, wait.RetryAfter)
			after, err := l.State(ctx, "tight")
			require.NoError(t, err)
			require.InDelta(t, before.RequestLevel, after.RequestLevel, 0.01, "a denial takes no request")
			require.InDelta(t, before.TokenLevel, after.TokenLevel, 0.5, "a denial takes no tokens")
			require.Equal(t, 2, after.InFlight)

			// A slot is free but the token bucket (200 left) is not: still
			// nothing is taken, and the wait is the tokens' refill time.
			require.NoError(t, p1.Release(ctx, admission.CallOutcome{Result: admission.CallUncertain}))
			_, err = l.Acquire(ctx, req)
			require.ErrorAs(t, err, &wait)
			require.Equal(t, admission.ReasonTokens, wait.Reason)
			require.InDelta(t, (400-200)*10*time.Second.Seconds(), wait.RetryAfter.Seconds(), 15, "200 tokens at 0.1 per second")
			d, ok := admission.WaitDuration(err)
			require.True(t, ok)
			require.Equal(t, wait.RetryAfter, d)

			// The request bucket empties last: one left, then a wait of a
			// minute at 1 RPM.
			p3, err := l.Acquire(ctx, admission.Request{Pool: "tight", Tokens: 1})
			require.NoError(t, err)
			require.NoError(t, p3.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 1}))
			_, err = l.Acquire(ctx, admission.Request{Pool: "tight", Tokens: 1})
			require.ErrorAs(t, err, &wait)
			require.Equal(t, admission.ReasonRequests, wait.Reason)
			require.InDelta(t, 60, wait.RetryAfter.Seconds(), 1)
		})
	}
}

func TestAcquireRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for kind, l := range f.limiters(slow("p")) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			_, err := l.Acquire(ctx, admission.Request{Pool: "p", Tokens: 1001})
			var never *admission.NeverAdmissibleError
			require.ErrorAs(t, err, &never)
			require.ErrorIs(t, err, admission.ErrNeverAdmissible)
			require.Equal(t, int64(1000), never.TokenBurst)
			require.NotErrorIs(t, err, admission.ErrWait, "never admissible is not a wait")

			_, err = l.Acquire(ctx, admission.Request{Pool: "nope"})
			require.ErrorIs(t, err, admission.ErrUnknownPool)

			for _, bad := range []admission.Request{{}, {Pool: "p", Tokens: -1}, {Pool: "p\x00"}} {
				_, err = l.Acquire(ctx, bad)
				var v *llmqtype.ValidationError
				require.ErrorAs(t, err, &v)
				require.ErrorIs(t, err, admission.ErrInvalid)
			}
			p, err := l.Acquire(ctx, admission.Request{Pool: "p"})
			require.NoError(t, err)
			require.ErrorIs(t, p.Release(ctx, admission.CallOutcome{Result: admission.CallNotSent, InputTokens: 3}), admission.ErrInvalid,
				"a call that was never sent used no tokens")
			require.ErrorIs(t, p.Release(ctx, admission.CallOutcome{Result: 7}), admission.ErrInvalid)
			require.NoError(t, p.Release(ctx, admission.CallOutcome{}), "a refused release does not use up the permit")
		})
	}
	for _, bad := range []admission.Pool{
		{Name: "", RPM: 1, TPM: 1, MaxInFlight: 1},
		{Name: "x", RPM: 0, TPM: 1, MaxInFlight: 1},
		{Name: "x", RPM: 1, TPM: 0, MaxInFlight: 1},
		{Name: "x", RPM: 1, TPM: 1, MaxInFlight: 0},
		{Name: "x", RPM: 1, TPM: 1, MaxInFlight: 1, TokenBurst: -1},
	} {
		require.ErrorIs(t, f.pg.SetPool(t.Context(), bad), admission.ErrInvalid)
	}
}

// Limits are data: raising a pool's in-flight limit lets a waiting acquire
// through at once, in every process; lowering the bursts clamps the levels.
func TestSetPoolAtRunTime(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pool := slow("live")
	pool.MaxInFlight = 1
	for kind, l := range f.limiters(pool) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			_, err := l.Acquire(ctx, admission.Request{Pool: "live", Tokens: 10})
			require.NoError(t, err)
			_, err = l.Acquire(ctx, admission.Request{Pool: "live", Tokens: 10})
			require.ErrorIs(t, err, admission.ErrWait)

			raised := pool
			raised.MaxInFlight, raised.RequestBurst, raised.TokenBurst = 2, 5, 500
			require.NoError(t, l.SetPool(ctx, raised))
			_, err = l.Acquire(ctx, admission.Request{Pool: "live", Tokens: 10})
			require.NoError(t, err)
			s, err := l.State(ctx, "live")
			require.NoError(t, err)
			require.Equal(t, 2, s.MaxInFlight)
			require.LessOrEqual(t, s.RequestLevel, 5.0)
			require.LessOrEqual(t, s.TokenLevel, 500.0)
			require.InDelta(t, 4, s.RequestLevel, 0.1, "levels are kept, clamped to the new burst")
		})
	}
}

func TestCooldownAndRemaining(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for kind, l := range f.limiters(slow("cool"), slow("lower")) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			h := http.Header{}
			h.Set("Retry-After", "5")
			sig, err := admission.Observe(ctx, l, "cool", http.StatusTooManyRequests, h)
			require.NoError(t, err)
			require.Equal(t, 5*time.Second, sig.Cooldown)
			_, err = l.Acquire(ctx, admission.Request{Pool: "cool"})
			var wait *admission.WaitError
			require.ErrorAs(t, err, &wait)
			require.Equal(t, admission.ReasonCooldown, wait.Reason)
			require.InDelta(t, 5, wait.RetryAfter.Seconds(), 0.5)
			err = l.Ready(ctx, "cool", 0)
			require.ErrorAs(t, err, &wait, "Ready sees the cooldown too")
			require.InDelta(t, 5, wait.RetryAfter.Seconds(), 0.5)
			require.NoError(t, l.Ready(ctx, "lower", 0), "a pool with budget is ready now")

			require.NoError(t, l.Cooldown(ctx, "cool", time.Second))
			_, err = l.Acquire(ctx, admission.Request{Pool: "cool"})
			require.ErrorAs(t, err, &wait)
			require.Greater(t, wait.RetryAfter, 3*time.Second, "a shorter cooldown never cuts a longer one")

			h = http.Header{}
			h.Set("X-Ratelimit-Remaining-Requests", "4")
			h.Set("X-Ratelimit-Remaining-Tokens", "300")
			h.Set("X-Ratelimit-Reset-Tokens", "6m0s")
			_, err = admission.Observe(ctx, l, "lower", http.StatusOK, h)
			require.NoError(t, err)
			s, err := l.State(ctx, "lower")
			require.NoError(t, err)
			require.InDelta(t, 4, s.RequestLevel, 0.1)
			require.InDelta(t, 300, s.TokenLevel, 1)

			h.Set("X-Ratelimit-Remaining-Requests", "9")
			h.Set("X-Ratelimit-Remaining-Tokens", "900")
			_, err = admission.Observe(ctx, l, "lower", http.StatusOK, h)
			require.NoError(t, err)
			s, err = l.State(ctx, "lower")
			require.NoError(t, err)
			require.InDelta(t, 4, s.RequestLevel, 0.1, "a provider's remaining budget never raises a bucket")
			require.InDelta(t, 300, s.TokenLevel, 1)
		})
	}
}

// A permit whose holder never releases it gives its slot back once it
// expires; the counter then equals the live permits.
func TestPermitExpires(t *testing.T) {
	t.Parallel()
	f := setup(t, admission.Config{PermitTTL: time.Second})
	pool := slow("ttl")
	pool.MaxInFlight = 1
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	_, err := f.pg.Acquire(t.Context(), admission.Request{Pool: "ttl"}) // abandoned
	require.NoError(t, err)
	_, err = f.pg.Acquire(t.Context(), admission.Request{Pool: "ttl"})
	require.ErrorIs(t, err, admission.ErrWait)

	var p *admission.Permit
	require.Eventually(t, func() bool {
		p, err = f.pg.Acquire(t.Context(), admission.Request{Pool: "ttl"})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
	inFlight, permits, err := f.pg.Counts(t.Context(), "ttl")
	require.NoError(t, err)
	require.Equal(t, 1, inFlight)
	require.Equal(t, 1, permits)
	require.NoError(t, p.Release(t.Context(), admission.CallOutcome{Result: admission.CallAnswered}))
	inFlight, permits, err = f.pg.Counts(t.Context(), "ttl")
	require.NoError(t, err)
	require.Zero(t, inFlight)
	require.Zero(t, permits)
}
