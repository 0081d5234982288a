package localserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/admission/kvfeedback"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/examples/localserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, cfg localserver.Config) (*localserver.Server, *httptest.Server) {
	t.Helper()
	s := localserver.New(cfg)
	srv := httptest.NewServer(s)
	t.Cleanup(func() { srv.Close(); s.Close() })
	return s, srv
}

// Requests whose contexts fit the cache together run at once, with no
// preemption, and report the usage they ran with.
func TestRequestsThatFitRunTogether(t *testing.T) {
	t.Parallel()
	s, srv := start(t, localserver.Config{KVTokens: 10_000, OutputTokens: 50, Scale: 100})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			out, status, err := localserver.Post(t.Context(), srv.URL, 1_000, 100)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, status)
			require.Equal(t, fakeprovider.Usage{PromptTokens: 1_000, CompletionTokens: 50, TotalTokens: 1_050}, out.Usage)
		})
	}
	wg.Wait()
	st := s.Stats()
	require.Equal(t, int64(4), st.Completed)
	require.Zero(t, st.Preemptions)
	require.Zero(t, st.KVUsed, "every finished request freed its cache")
	require.Equal(t, int64(200), st.GenerationTokens)
}

// An overcommitted cache preempts: two requests admitted on their prompts
// outgrow the cache as they generate, the later one is preempted and
// recomputed, and both still finish.
func TestOvercommitPreemptsAndRecomputes(t *testing.T) {
	t.Parallel()
	s, srv := start(t, localserver.Config{KVTokens: 1_000, OutputTokens: 300, Scale: 100})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_, status, err := localserver.Post(t.Context(), srv.URL, 401, 300)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, status)
		})
	}
	wg.Wait()
	st := s.Stats()
	require.Equal(t, int64(2), st.Completed)
	require.Positive(t, st.Preemptions)
	require.Greater(t, st.PromptTokens, int64(2*401), "a preempted request is prefilled again, its generated tokens too")
	require.Equal(t, int64(2*300), st.GenerationTokens, "what it had generated is kept, and recomputed")

	_, status, err := localserver.Post(t.Context(), srv.URL, 900, 200)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, status, "a context longer than the model's is refused")
}

// /metrics reports the engine under vLLM's names, and a shrunk cache
// preempts what no longer fits.
func TestMetricsAndDegrade(t *testing.T) {
	t.Parallel()
	s, srv := start(t, localserver.Config{KVTokens: 10_000, OutputTokens: 400, Scale: 50})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { _, _, _ = localserver.Post(ctx, srv.URL, 3_000, 400) })
	}
	require.Eventually(t, func() bool { return s.Stats().Running == 3 }, 10*time.Second, time.Millisecond)
	s.Degrade(0.5)
	require.Eventually(t, func() bool { return s.Stats().Preemptions > 0 }, 10*time.Second, time.Millisecond)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/metrics", http.NoBody)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_count",
		"vllm:e2e_request_latency_seconds_bucket"} {
		require.Contains(t, string(body), name+"{model_name=\"local\"")
	}
	require.Regexp(t, `vllm:num_requests_waiting\{model_name="local"\} [1-9]`, string(body), "preempted requests wait")
	s.Degrade(1)
	cancel() // the clients give up: their cache is freed
	wg.Wait()
	require.Eventually(t, func() bool { st := s.Stats(); return st.KVUsed == 0 && st.Running == 0 && st.Waiting == 0 },
		10*time.Second, time.Millisecond)
	require.Equal(t, int64(3), s.Stats().Aborted)
}

// The in-flight token budget keeps the server from ever preempting: the
// reservations in flight (prompt plus max_tokens) fit its cache, so what
// they grow to does too. A request-count limit with room for several long
// contexts overcommits the same cache, and the server preempts.
func TestTokenBudgetNeverPreempts(t *testing.T) {
	t.Parallel()
	// Four such contexts fit the cache on their prompts (199,800 tokens)
	// but not once they have generated their 400 tokens: a server that
	// admits on what requests need now overcommits, whatever the order.
	backlog := make([]localserver.Document, 8)
	for i := range backlog {
		backlog[i].PromptTokens = 49_950
	}
	run := func(p admission.Pool) localserver.BacklogResult {
		t.Helper()
		s, srv := start(t, localserver.Config{KVTokens: 200_000, OutputTokens: 400, Scale: 100})
		l, err := admission.NewLocal(p)
		require.NoError(t, err)
		r, err := localserver.RunBacklog(t.Context(), s, backlog, localserver.BacklogOptions{URL: srv.URL, Limiter: l, Pool: p.Name, MaxTokens: 500})
		require.NoError(t, err)
		return r
	}
	base := admission.Pool{Name: "local", RPM: 1 << 30, TPM: 1 << 50, TokenBurst: 1 << 40, MaxInFlight: 256}
	budget := base
	budget.MaxInFlightTokens = 200_000
	tok := run(budget)
	require.Zero(t, tok.Preemptions, "the budget never overcommits the cache")
	count := base
	count.MaxInFlight = 32
	many := run(count)
	require.Positive(t, many.Preemptions, "32 requests in flight overcommit the cache")
	t.Logf("token budget: %+v; 32 in flight: %+v", tok, many)
}

// The feedback loop: while the server's cache is shrunk, the server
// preempts and queues, and the observer lowers the pool's budget; once it
// is restored, the budget climbs back to the ceiling within the
// documented number of quiet readings, and stays there.
func TestFeedbackFollowsTheServer(t *testing.T) {
	t.Parallel()
	s, srv := start(t, localserver.Config{KVTokens: 100_000, OutputTokens: 400, Scale: 50})
	pool := admission.Pool{Name: "local", RPM: 1 << 30, TPM: 1 << 50, TokenBurst: 1 << 40, MaxInFlight: 256, MaxInFlightTokens: 100_000}
	l, err := admission.NewLocal(pool)
	require.NoError(t, err)
	obs, err := kvfeedback.New(l, kvfeedback.Config{Pool: "local", MetricsURL: srv.URL + "/metrics", Ceiling: 100_000})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { // load that fills the budget
		_, _ = localserver.RunBacklog(ctx, nil, localserver.MixedBacklog(400, 3), localserver.BacklogOptions{URL: srv.URL, Limiter: l, Pool: "local", Workers: 32, MaxTokens: 500})
	})
	defer func() { cancel(); wg.Wait() }()
	budget := func() int64 {
		st, err := l.State(t.Context(), "local")
		require.NoError(t, err)
		return st.MaxInFlightTokens
	}
	require.Eventually(t, func() bool { return s.Stats().KVUsed > 50_000 }, 10*time.Second, time.Millisecond, "the load fills the cache")
	s.Degrade(0.3)
	var lowest int64 = 100_000
	require.Eventually(t, func() bool {
		r, err := obs.Step(t.Context())
		require.NoError(t, err)
		lowest = min(lowest, r.Budget)
		return r.Budget <= 50_000
	}, 20*time.Second, 20*time.Millisecond, "pressure lowers the budget")
	s.Degrade(1)
	readings := 0
	for i := 0; budget() < 100_000; i++ {
		require.Less(t, i, 500, "the server never quietened")
		r, err := obs.Step(t.Context())
		require.NoError(t, err)
		if r.Pressure != "" {
			continue // the server still catching up with the preempted requests
		}
		readings++
		require.LessOrEqual(t, readings, 18, "back at the ceiling within 18 quiet readings (from the floor at worst)")
	}
	require.Equal(t, int64(100_000), budget())
	for range 10 { // the cache is whole again: the budget keeps it from preempting, and nothing oscillates
		r, err := obs.Step(t.Context())
		require.NoError(t, err)
		require.Empty(t, r.Pressure)
		require.Equal(t, int64(100_000), r.Budget)
	}
	t.Logf("lowest budget %d; back at the ceiling after %d quiet readings", lowest, readings)
}
