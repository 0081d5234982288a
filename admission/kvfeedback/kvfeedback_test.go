package kvfeedback_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/admission/kvfeedback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server serves a metrics page the test sets.
type server struct {
	mu   sync.Mutex
	page string
	down bool
}

func (s *server) set(waiting, preemptions, ttftSum, ttftCount float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.page = fmt.Sprintf(`# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %g
vllm:num_requests_waiting{model_name="other"} 7
vllm:num_requests_running{model_name="m"} 3
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:num_preemptions_total{model_name="m"} %g
vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} %g
vllm:time_to_first_token_seconds_sum{model_name="m"} %g
vllm:time_to_first_token_seconds_count{model_name="m"} %g
`, waiting, preemptions, ttftCount, ttftSum, ttftCount)
}

func (s *server) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte(s.page))
}

func setup(t *testing.T, cfg kvfeedback.Config) (*kvfeedback.Observer, *server, *admission.Local) {
	t.Helper()
	l, err := admission.NewLocal(admission.Pool{Name: "gpu", RPM: 1000, TPM: 1 << 30, MaxInFlight: 10, MaxInFlightTokens: 100_000})
	require.NoError(t, err)
	s := &server{}
	s.set(0, 0, 0, 0)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	cfg.Pool, cfg.MetricsURL, cfg.Model = "gpu", srv.URL+"/metrics", "m"
	cfg.Ceiling = 100_000
	o, err := kvfeedback.New(l, cfg)
	require.NoError(t, err)
	return o, s, l
}

// The control law: waiting or new preemptions lower the budget by the
// decrease factor, never below the floor; quiet readings raise it by the
// increase, never above the ceiling, so one decrease is made good in six
// readings and the floor in eighteen; a failed reading changes nothing.
func TestControlLaw(t *testing.T) {
	t.Parallel()
	o, s, l := setup(t, kvfeedback.Config{})
	ctx := t.Context()
	budget := func() int64 {
		st, err := l.State(ctx, "gpu")
		require.NoError(t, err)
		return st.MaxInFlightTokens
	}
	r, err := o.Step(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Pressure)
	require.Equal(t, int64(100_000), budget(), "quiet at the ceiling: it stays")
	require.InDelta(t, 0.5, r.KVUsage, 1e-9)
	require.InDelta(t, 3, r.Running, 1e-9, "only the model asked for is read")

	s.set(2, 0, 0, 0) // requests queue in the server
	r, err = o.Step(ctx)
	require.NoError(t, err)
	require.Equal(t, "waiting", r.Pressure)
	require.Equal(t, int64(70_000), budget())
	s.set(0, 0, 0, 0)
	for i := range 6 {
		_, err = o.Step(ctx)
		require.NoError(t, err)
		require.Equal(t, min(int64(100_000), 70_000+int64(i+1)*5_000), budget())
	}
	require.Equal(t, int64(100_000), budget(), "one decrease made good in six quiet readings")

	// Preemptions counted since the last reading, again and again: down to
	// the floor and no further.
	for n := 1; n <= 12; n++ {
		s.set(0, float64(n), 0, 0)
		r, err = o.Step(ctx)
		require.NoError(t, err)
		require.Equal(t, "preemptions", r.Pressure)
	}
	require.Equal(t, int64(10_000), budget(), "the floor: Ceiling/10")
	s.set(0, 0, 0, 0) // the server restarted: its counter went down
	quiet := 0
	for budget() < 100_000 {
		r, err = o.Step(ctx)
		require.NoError(t, err)
		require.Empty(t, r.Pressure, "a counter that went down is a new baseline")
		quiet++
	}
	require.Equal(t, 18, quiet, "from the floor to the ceiling in eighteen readings")

	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	_, err = o.Step(ctx)
	require.Error(t, err)
	require.Equal(t, int64(100_000), budget(), "a failed reading changes nothing")
}

// With MaxTTFT, a mean time to first token above it since the last
// reading is pressure; below it is not.
func TestTimeToFirstToken(t *testing.T) {
	t.Parallel()
	o, s, l := setup(t, kvfeedback.Config{MaxTTFT: 2_000_000_000}) // 2s
	ctx := t.Context()
	s.set(0, 0, 10, 10) // mean 1s so far
	_, err := o.Step(ctx)
	require.NoError(t, err)
	s.set(0, 0, 10+4*3, 14) // four more, 3s each
	r, err := o.Step(ctx)
	require.NoError(t, err)
	require.Equal(t, "ttft", r.Pressure)
	st, err := l.State(ctx, "gpu")
	require.NoError(t, err)
	require.Equal(t, int64(70_000), st.MaxInFlightTokens)
	s.set(0, 0, 22+4*1, 18) // four more, 1s each
	r, err = o.Step(ctx)
	require.NoError(t, err)
	require.Empty(t, r.Pressure)
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	good := kvfeedback.Config{Pool: "p", MetricsURL: "http://127.0.0.1:1/metrics", Ceiling: 10}
	requireRefused(t, good, map[string]func(c *kvfeedback.Config){
		"Pool":       func(c *kvfeedback.Config) { c.Pool = "" },
		"MetricsURL": func(c *kvfeedback.Config) { c.MetricsURL = "file:///etc/passwd" },
		"Ceiling":    func(c *kvfeedback.Config) { c.Ceiling = 0 },
		"Floor":      func(c *kvfeedback.Config) { c.Floor = 11 },
		"Decrease":   func(c *kvfeedback.Config) { c.Decrease = 1.5 },
		"MaxTTFT":    func(c *kvfeedback.Config) { c.MaxTTFT = -1 },
	})
}

// requireRefused checks that New accepts good, and refuses good changed by
// each of bad, with an error naming the field it is keyed by.
func requireRefused(t *testing.T, good kvfeedback.Config, bad map[string]func(c *kvfeedback.Config)) {
	t.Helper()
	l, err := admission.NewLocal()
	require.NoError(t, err)
	for field, spoil := range bad {
		c := good
		spoil(&c)
		_, err := kvfeedback.New(l, c)
		require.ErrorIs(t, err, kvfeedback.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field)
	}
	_, err = kvfeedback.New(l, good)
	require.NoError(t, err)
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	m, err := kvfeedback.ParseMetrics(strings.NewReader(`# comment
a_total{x="1",model_name="m"} 2 1700000000000
a_total{model_name="m", y="a \"quoted\" } value"} 3
b{model_name="n"} +Inf
c 1e3

`), "m")
	require.NoError(t, err)
	require.Equal(t, kvfeedback.Metrics{"a_total": 5}, m)
	all, err := kvfeedback.ParseMetrics(strings.NewReader("b{model_name=\"n\"} 4\nc 1e3\n"), "")
	require.NoError(t, err)
	require.Equal(t, kvfeedback.Metrics{"b": 4, "c": 1000}, all)
	for _, bad := range []string{"novalue", "x{a=1} 2", `x{a="1" 2`, "x 1 2 3", "x two", "9x 1", `x{a="1"b="2"} 3`} {
		_, err := kvfeedback.ParseMetrics(strings.NewReader(bad), "")
		require.ErrorIs(t, err, kvfeedback.ErrMalformed, bad)
		require.ErrorContains(t, err, "line 1", bad)
	}
	_, err = kvfeedback.ParseMetrics(bytes.NewReader(bytes.Repeat([]byte("x 1\n"), kvfeedback.MaxMetricsBytes/4+1)), "")
	require.ErrorIs(t, err, kvfeedback.ErrMalformed, "a page over the bound")
}

// FuzzParseMetrics: any input is parsed or refused with ErrMalformed,
// never a panic; what is parsed has names of metric characters only.
func FuzzParseMetrics(f *testing.F) {
	for _, seed := range []string{
		"vllm:num_requests_waiting{model_name=\"m\"} 3\n", "a 1\n# c\n\nb{x=\"\\\"\"} NaN 12\n", "x{", "x{a=\"", "{} 1", "x -Inf",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, page string) {
		m, err := kvfeedback.ParseMetrics(strings.NewReader(page), "")
		if err != nil {
			require.ErrorIs(t, err, kvfeedback.ErrMalformed)
			return
		}
		for name := range m {
			require.NotEmpty(t, name)
			require.NotContains(t, name, "{")
			require.NotContains(t, name, " ")
		}
	})
}
