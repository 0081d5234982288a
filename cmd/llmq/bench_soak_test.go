package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
)

// A short soak runs arrivals through a runner, a relay and retention,
// reports per sample, and ends with the summary line in its exact form.
func TestBenchSoak(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, "bench", "-mode", "soak", "-duration", "3s", "-rate", "20", "-retention", "1s", "-sample", "1s", "-database-url", dbtest.URL())
	require.Equal(t, 0, code, stderr)
	// The server's autovacuum setting is stated, and warned about when off.
	m := regexp.MustCompile(`(?m)^llmq bench: mode=soak .* autovacuum=(\w+) `).FindStringSubmatch(stderr)
	require.NotNil(t, m, stderr)
	require.Equal(t, m[1] != "on", regexp.MustCompile(`warning: autovacuum is off`).MatchString(stderr), stderr)
	require.Regexp(t, `(?m)^llmq soak t=\S+ completed_per_s=\S+ pickup_p99_ms=\S+ wal_bytes_per_job=\d+ dead_tuples=\d+ total_bytes=\d+ bench_heap_bytes=\d+$`, out)
	require.Regexp(t, `(?m)^llmq soak sizes .*jobs=\d+ .*jobs_finished_idx=\d+ .*outbox=\d+`, out)
	last := regexp.MustCompile(`llmq soak minutes=(\S+) rate=20 first_per_s=(\S+) last_per_s=(\S+) first_p99_ms=(\S+) last_p99_ms=(\S+) growth_pct=(\S+)\n$`).FindStringSubmatch(out)
	require.NotNil(t, last, out)
	require.Equal(t, "0.05", last[1])
	// Jobs ran. Which third a completion counts in is TestSoakThirds'
	// business: in three seconds on a loaded machine, a second without a
	// completion proves nothing.
	var completed float64
	for _, m := range regexp.MustCompile(`(?m)^llmq soak t=\S+ completed_per_s=(\S+) `).FindAllStringSubmatch(out, -1) {
		perS, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		completed += perS
	}
	require.Positive(t, completed, "no job completed:\n%s\n%s", out, stderr)

	for _, bad := range [][]string{{"-duration", "1s"}, {"-rate", "0"}, {"-retention", "soon"}} {
		code, _, stderr := runCLI(t, append([]string{"bench", "-mode", "soak", "-database-url", dbtest.URL()}, bad...)...)
		require.Equal(t, 2, code, "%v: %s", bad, stderr)
	}
}

// A completion counts in the third of the run it happened in, the end in
// the last, and the summary divides each third's count by its seconds.
func TestSoakThirds(t *testing.T) {
	t.Parallel()
	s := &soak{o: soakOptions{duration: 3 * time.Minute, rate: 20}}
	for ago, want := range map[time.Duration]int{0: 0, 50 * time.Second: 0, 70 * time.Second: 1, 150 * time.Second: 2, time.Hour: 2} {
		s.start = time.Now().Add(-ago)
		require.Equal(t, want, s.third(), "%s into the run", ago)
	}
	var out strings.Builder
	s.out = &out
	s.thirdDone[0].Store(1200)
	s.thirdDone[1].Store(1)
	s.thirdDone[2].Store(600)
	require.NoError(t, s.summary(100, 150))
	require.Equal(t, "llmq soak minutes=3 rate=20 first_per_s=20.0 last_per_s=10.0 first_p99_ms=0.0 last_p99_ms=0.0 growth_pct=50.0\n", out.String())
}

func TestIsSoak(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-mode", "soak"}, {"--mode", "soak"}, {"-mode=soak"}, {"-rate", "5", "--mode=soak"}} {
		require.True(t, isSoak(args), "%v", args)
	}
	for _, args := range [][]string{{"-mode", "drain"}, {"soak"}, {"-schema", "mode", "soak"}} {
		require.False(t, isSoak(args), "%v", args)
	}
}

// The soak's latency histogram reads a p99 within its 2 % bucket width of
// the exact one, in a fixed size whatever the number of samples.
func TestLatencyHistP99(t *testing.T) {
	t.Parallel()
	var h latencyHist
	require.Zero(t, h.p99ms())
	for i := 1; i <= 100_000; i++ {
		h.add(time.Duration(i) * time.Microsecond) // 1 µs to 100 ms, uniform
	}
	require.InEpsilon(t, 99.0, h.p99ms(), 0.02)
	h.add(time.Hour) // beyond the last bucket: counted there
	require.Equal(t, int64(100_001), h.n)
}

// The top bucket reaches about 65 minutes (10 µs × 1.02^999), as the
// histogram's doc says: an hour reads within 2 %, and anything longer
// reads as the top bucket's bound.
func TestLatencyHistRange(t *testing.T) {
	t.Parallel()
	var h latencyHist
	h.add(time.Hour)
	require.InEpsilon(t, float64(time.Hour/time.Millisecond), h.p99ms(), 0.02)
	var long latencyHist
	long.add(3 * time.Hour)
	top := time.Duration(long.p99ms() * float64(time.Millisecond))
	require.InDelta(t, 65*time.Minute, top, float64(10*time.Second), "the top bucket's bound is %s", top)
}
