package llmqtype_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/llmqtype"
)

const maxDuration = time.Duration(math.MaxInt64)

func constant(r float64) func() float64 { return func() float64 { return r } }

func TestWithDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, llmqtype.BackoffPolicy{Base: 2 * time.Second, Cap: time.Minute}, llmqtype.BackoffPolicy{}.WithDefaults())
	require.Equal(t, llmqtype.BackoffPolicy{Base: time.Second, Cap: time.Minute}, llmqtype.BackoffPolicy{Base: time.Second}.WithDefaults())
	require.Equal(t, llmqtype.BackoffPolicy{Base: 2 * time.Second, Cap: time.Hour}, llmqtype.BackoffPolicy{Cap: time.Hour}.WithDefaults())
	require.Equal(t, llmqtype.BackoffPolicy{Base: -1, Cap: -1}, llmqtype.BackoffPolicy{Base: -1, Cap: -1}.WithDefaults(), "only zero means default")
}

func TestCeiling(t *testing.T) {
	t.Parallel()
	custom := llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second}
	tiny := llmqtype.BackoffPolicy{Base: 1, Cap: maxDuration}
	odd := llmqtype.BackoffPolicy{Base: 3, Cap: maxDuration}
	for _, tc := range []struct {
		policy  llmqtype.BackoffPolicy
		attempt int
		want    time.Duration
	}{
		{llmqtype.BackoffPolicy{}, 1, 2 * time.Second},
		{llmqtype.BackoffPolicy{}, 2, 4 * time.Second},
		{llmqtype.BackoffPolicy{}, 3, 8 * time.Second},
		{llmqtype.BackoffPolicy{}, 4, 16 * time.Second},
		{llmqtype.BackoffPolicy{}, 5, 32 * time.Second},
		{llmqtype.BackoffPolicy{}, 6, time.Minute},
		{llmqtype.BackoffPolicy{}, 7, time.Minute},
		{llmqtype.BackoffPolicy{}, 8, time.Minute},
		{llmqtype.BackoffPolicy{}, 0, 2 * time.Second},
		{llmqtype.BackoffPolicy{}, -5, 2 * time.Second},
		{llmqtype.BackoffPolicy{}, math.MinInt, 2 * time.Second},
		{llmqtype.BackoffPolicy{}, 64, time.Minute},
		{llmqtype.BackoffPolicy{}, 10_000, time.Minute},
		{llmqtype.BackoffPolicy{}, 1 << 30, time.Minute},
		{llmqtype.BackoffPolicy{}, math.MaxInt, time.Minute},

		{custom, 1, 100 * time.Millisecond},
		{custom, 2, 200 * time.Millisecond},
		{custom, 3, 400 * time.Millisecond},
		{custom, 4, 800 * time.Millisecond},
		{custom, 5, time.Second},
		{custom, 6, time.Second},
		{custom, 7, time.Second},
		{custom, 8, time.Second},
		{custom, 1 << 30, time.Second},

		// At the edge of int64: the largest doublings that still fit, and
		// the first that would not.
		{tiny, 63, 1 << 62},
		{tiny, 64, maxDuration},
		{tiny, 65, maxDuration},
		{odd, 62, 3 << 61},
		{odd, 63, maxDuration},
		{odd, 1 << 30, maxDuration},

		{llmqtype.BackoffPolicy{Base: time.Minute, Cap: time.Minute}, 1, time.Minute},
		{llmqtype.BackoffPolicy{Base: time.Minute, Cap: time.Minute}, 1 << 30, time.Minute},

		// Invalid policies (Validate refuses them) still give a ceiling that
		// is never negative.
		{llmqtype.BackoffPolicy{Base: 10 * time.Second, Cap: 5 * time.Second}, 1, 5 * time.Second},
		{llmqtype.BackoffPolicy{Base: -time.Second}, 3, 0},
		{llmqtype.BackoffPolicy{Cap: -time.Second}, 3, 0},
	} {
		require.Equal(t, tc.want, tc.policy.Ceiling(tc.attempt), "%+v attempt %d", tc.policy, tc.attempt)
	}
}

func TestDelayStaysWithinCeiling(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2)) // seeded, so a failure reproduces
	for _, p := range []llmqtype.BackoffPolicy{{}, {Base: time.Millisecond, Cap: time.Hour}} {
		for attempt := 1; attempt <= 12; attempt++ {
			ceiling := p.Ceiling(attempt)
			for range 10_000 {
				d := p.Delay(attempt, rng.Float64)
				if d < 0 || d >= ceiling {
					require.Failf(t, "delay out of bounds", "%+v attempt %d: %v not in [0, %v)", p, attempt, d, ceiling)
				}
			}
		}
	}
}

// TestDelayIsSpread fails for a jitter that is constant, always zero, or
// always the ceiling: the draws must cover the range evenly.
func TestDelayIsSpread(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var p llmqtype.BackoffPolicy
	const attempt, draws = 4, 10_000
	ceiling := p.Ceiling(attempt)
	require.Equal(t, 16*time.Second, ceiling)

	var sum float64
	lowest, highest := ceiling, time.Duration(0)
	for range draws {
		d := p.Delay(attempt, rng.Float64)
		sum += float64(d)
		lowest, highest = min(lowest, d), max(highest, d)
	}
	half := float64(ceiling) / 2
	require.InEpsilon(t, half, sum/draws, 0.10, "mean of the draws")
	require.Less(t, lowest, ceiling/10, "no draw near 0")
	require.Greater(t, highest, ceiling*9/10, "no draw near the ceiling")
}

func TestDelayEdges(t *testing.T) {
	t.Parallel()
	var p llmqtype.BackoffPolicy
	ceiling := p.Ceiling(1)
	require.Equal(t, time.Duration(0), p.Delay(1, constant(0)))
	d := p.Delay(1, constant(0.999999))
	require.Less(t, d, ceiling)
	require.GreaterOrEqual(t, d, ceiling-ceiling/100_000)
	require.Equal(t, time.Second, p.Delay(1, constant(0.5)))
	require.Equal(t, 30*time.Second, p.Delay(1<<30, constant(0.5)))

	// A random function outside its contract is clamped into [0, 1).
	require.Equal(t, ceiling-1, p.Delay(1, constant(1)))
	require.Equal(t, ceiling-1, p.Delay(1, constant(7)))
	require.Equal(t, ceiling-1, p.Delay(1, constant(math.Inf(1))))
	require.Equal(t, time.Duration(0), p.Delay(1, constant(-0.5)))
	require.Equal(t, time.Duration(0), p.Delay(1, constant(math.NaN())))

	// Near 2^63 float64 rounds the ceiling up; the draw must still stay
	// below it and not wrap negative.
	huge := llmqtype.BackoffPolicy{Base: 1, Cap: maxDuration}
	d = huge.Delay(64, constant(math.Nextafter(1, 0)))
	require.Positive(t, d)
	require.Less(t, d, maxDuration)

	// An invalid policy never yields a negative delay.
	require.Equal(t, time.Duration(0), llmqtype.BackoffPolicy{Base: -time.Second}.Delay(1, constant(0.5)))

	// nil means math/rand/v2's Float64.
	for range 100 {
		d := p.Delay(3, nil)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, p.Ceiling(3))
	}
}

func TestNext(t *testing.T) {
	t.Parallel()
	var p llmqtype.BackoffPolicy
	half := constant(0.5) // Delay(1) is 1s, Delay(3) is 4s
	require.Equal(t, 5*time.Second, p.Next(1, 5*time.Second, half), "a longer Retry-After wins")
	require.Equal(t, time.Second, p.Next(1, 500*time.Millisecond, half), "a shorter Retry-After does not lower the delay")
	require.Equal(t, 4*time.Second, p.Next(3, 4*time.Second, half))
	require.Equal(t, time.Second, p.Next(1, 0, half), "0 means no Retry-After")
	require.Equal(t, time.Second, p.Next(1, -time.Hour, half), "negative means no Retry-After")
	require.Equal(t, llmqtype.MaxRetryAfter, p.Next(1, 100*365*24*time.Hour, half), "clamped")
	require.Equal(t, llmqtype.MaxRetryAfter, p.Next(1, maxDuration, half), "clamped")

	// The random function is drawn from once whether or not Retry-After
	// wins, so a seeded sequence does not depend on the server.
	calls := 0
	counting := func() float64 { calls++; return 0.5 }
	p.Next(1, time.Hour, counting)
	p.Next(1, 0, counting)
	require.Equal(t, 2, calls)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []llmqtype.BackoffPolicy{
		{},
		{Base: time.Second},
		{Base: time.Minute}, // equal to the default Cap
		{Base: time.Minute, Cap: time.Minute},
		{Base: time.Millisecond, Cap: 24 * time.Hour},
		{Cap: time.Hour},
	} {
		require.NoError(t, ok.Validate(), "%+v", ok)
	}
	for _, tc := range []struct {
		policy  llmqtype.BackoffPolicy
		field   string
		problem string
	}{
		{llmqtype.BackoffPolicy{Base: -time.Second}, "Base", "negative"},
		{llmqtype.BackoffPolicy{Base: -time.Second, Cap: time.Minute}, "Base", "negative"},
		{llmqtype.BackoffPolicy{Cap: -1}, "Cap", "negative"},
		{llmqtype.BackoffPolicy{Base: 10 * time.Second, Cap: 5 * time.Second}, "Cap", "less than Base"},
		{llmqtype.BackoffPolicy{Base: 90 * time.Second}, "Cap", "less than Base"}, // the default Cap is 60s
		{llmqtype.BackoffPolicy{Cap: time.Second}, "Cap", "less than Base"},       // the default Base is 2s
	} {
		err := tc.policy.Validate()
		require.ErrorIs(t, err, llmqtype.ErrInvalidBackoffPolicy, "%+v", tc.policy)
		require.ErrorContains(t, err, tc.field+": ", "%+v", tc.policy)
		require.ErrorContains(t, err, tc.problem, "%+v", tc.policy)
		var verr *llmqtype.ValidationError
		require.ErrorAs(t, err, &verr, "%+v", tc.policy)
		require.Equal(t, tc.field, verr.Field)
	}
}
