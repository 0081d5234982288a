package admission_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
)

// kvPool is a local inference server's pool: plenty of requests, tokens
// and slots, and an in-flight token budget (its KV cache) of 100,000.
func kvPool(name string) admission.Pool {
	return admission.Pool{Name: name, RPM: 600_000, TPM: 1 << 40, MaxInFlight: 100, MaxInFlightTokens: 100_000, TokenBurst: 1 << 30}
}

// The in-flight token budget admits requests while their reservations fit
// together, whatever their number: two 40,000-token contexts and then a
// 15,000 one fit, a third large one waits until one is released; a
// request larger than the budget is never admissible; and a release gives
// back the whole reservation, whatever the provider reported.
func TestInFlightTokenBudget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for kind, l := range f.limiters(kvPool("gpu")) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			large := admission.Request{Pool: "gpu", Tokens: 40_000}
			a, err := l.Acquire(ctx, large)
			require.NoError(t, err)
			b, err := l.Acquire(ctx, large)
			require.NoError(t, err)
			_, err = l.Acquire(ctx, large)
			var wait *admission.WaitError
			require.ErrorAs(t, err, &wait)
			require.Equal(t, admission.ReasonInFlightTokens, wait.Reason)
			require.Positive(t, wait.RetryAfter)
			small, err := l.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: 15_000})
			require.NoError(t, err, "a smaller context fits what is left")
			s, err := l.State(ctx, "gpu")
			require.NoError(t, err)
			require.Equal(t, int64(95_000), s.InFlightTokens)
			require.Equal(t, 3, s.InFlight)
			require.ErrorIs(t, l.Ready(ctx, "gpu", 40_000), admission.ErrWait)
			require.NoError(t, l.Ready(ctx, "gpu", 5_000))

			_, err = l.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: 100_001})
			var never *admission.NeverAdmissibleError
			require.ErrorAs(t, err, &never)
			require.Equal(t, int64(100_000), never.MaxInFlightTokens)
			require.Contains(t, err.Error(), "in-flight token budget is 100000")

			// The provider reported far fewer tokens than reserved: the
			// whole reservation comes back all the same.
			require.NoError(t, a.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 900, OutputTokens: 100}))
			c, err := l.Acquire(ctx, large)
			require.NoError(t, err, "released tokens serve the next context")
			for _, p := range []*admission.Permit{b, small, c} {
				require.NoError(t, p.Release(ctx, admission.CallOutcome{Result: admission.CallUncertain}))
			}
			s, err = l.State(ctx, "gpu")
			require.NoError(t, err)
			require.Zero(t, s.InFlightTokens)
			require.Zero(t, s.InFlight)
		})
	}
	require.ErrorIs(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "x", RPM: 1, TPM: 1, MaxInFlight: 1, MaxInFlightTokens: -1}), admission.ErrInvalid)
}

// Many concurrent acquirers in one process are granted in grouped cycles;
// the in-flight token budget holds across them: at no moment do the
// granted reservations exceed it, and the budget is used (the largest
// reservations in flight come close to it).
func TestInFlightTokenBudgetHoldsForConcurrentAcquirers(t *testing.T) {
	t.Parallel()
	f := setup(t, admission.Config{Timeout: 15 * time.Second})
	pool := kvPool("gpu")
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	ctx := t.Context()
	var (
		mu           sync.Mutex
		held, peak   int64
		wg           sync.WaitGroup
		grants, errs int
	)
	end := time.Now().Add(2 * time.Second)
	for i := range 100 {
		tokens := int64(1_000 + (i%10)*8_000) // 1k to 73k: short documents and long contexts
		wg.Go(func() {
			for time.Now().Before(end) {
				p, err := f.pg.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: tokens})
				if err != nil {
					d, ok := admission.WaitDuration(err)
					mu.Lock()
					if !ok {
						errs++
					}
					mu.Unlock()
					time.Sleep(min(d, 5*time.Millisecond)) // the limiter's own wait, shortened
					continue
				}
				mu.Lock()
				held += tokens
				peak = max(peak, held)
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond) // the call
				mu.Lock()
				held -= tokens
				mu.Unlock()
				if err := p.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: tokens}); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	t.Logf("grants %d, peak reserved in flight %d of %d", grants, peak, pool.MaxInFlightTokens)
	require.Zero(t, errs)
	require.Positive(t, grants)
	require.LessOrEqual(t, peak, pool.MaxInFlightTokens)
	require.Greater(t, peak, pool.MaxInFlightTokens/2, "the budget is used, not just respected")
	s, err := f.pg.State(ctx, "gpu")
	require.NoError(t, err)
	require.Zero(t, s.InFlightTokens, "every reservation came back")
	require.Zero(t, s.InFlight)
}

// An expired permit's reservation comes back with its slot when it is
// reaped, by a cycle short of budget or by Reap.
func TestExpiredPermitsReturnTheirTokens(t *testing.T) {
	t.Parallel()
	f := setup(t, admission.Config{PermitTTL: time.Second})
	require.NoError(t, f.pg.SetPool(t.Context(), kvPool("gpu")))
	ctx := t.Context()
	for range 2 {
		_, err := f.pg.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: 45_000}) // never released: its holder died
		require.NoError(t, err)
	}
	_, err := f.pg.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: 45_000})
	require.ErrorIs(t, err, admission.ErrWait)
	require.Eventually(t, func() bool {
		p, err := f.pg.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: 45_000})
		if err != nil {
			return false
		}
		require.NoError(t, p.Release(ctx, admission.CallOutcome{Result: admission.CallNotSent}))
		return true
	}, 10*time.Second, 50*time.Millisecond, "a cycle short of budget reaps the expired permits")
	require.Eventually(t, func() bool { // the second may have expired after that cycle
		_, err := f.pg.Reap(ctx, "gpu")
		require.NoError(t, err)
		s, err := f.pg.State(ctx, "gpu")
		require.NoError(t, err)
		return s.InFlight == 0 && s.InFlightTokens == 0
	}, 10*time.Second, 50*time.Millisecond)

	_, err = f.pg.Acquire(ctx, admission.Request{Pool: "gpu", Tokens: 30_000})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, err := f.pg.Reap(ctx, "gpu")
		require.NoError(t, err)
		return n == 1
	}, 10*time.Second, 50*time.Millisecond)
	s, err := f.pg.State(ctx, "gpu")
	require.NoError(t, err)
	require.Zero(t, s.InFlightTokens, "Reap returns the tokens with the slot")
}
