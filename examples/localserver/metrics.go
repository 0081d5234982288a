package localserver

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// histogram is a Prometheus histogram of seconds, with vLLM's buckets for
// request latencies.
type histogram struct {
	bounds []float64
	counts []int64 // per bucket, not cumulative
	sum    float64
	n      int64
}

func newHistogram() histogram {
	b := []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640}
	return histogram{bounds: b, counts: make([]int64, len(b))}
}

func (h *histogram) observe(v float64) {
	h.sum += v
	h.n++
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

func (h *histogram) write(b *strings.Builder, name, labels string) {
	fmt.Fprintf(b, "# TYPE %s histogram\n", name)
	var cum int64
	for i, bound := range h.bounds {
		cum += h.counts[i]
		fmt.Fprintf(b, "%s_bucket{%s,le=%q} %d\n", name, labels, strconv.FormatFloat(bound, 'g', -1, 64), cum)
	}
	fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, labels, h.n)
	fmt.Fprintf(b, "%s_sum{%s} %g\n", name, labels, h.sum)
	fmt.Fprintf(b, "%s_count{%s} %d\n", name, labels, h.n)
}

// metrics serves the engine's state in Prometheus text format, under
// vLLM's metric names.
func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	labels := fmt.Sprintf("model_name=%q", s.cfg.Model)
	usage := float64(s.kvUsed) / float64(s.capacity)
	var b strings.Builder
	gauge := func(name string, v float64) {
		fmt.Fprintf(&b, "# TYPE %s gauge\n%s{%s} %g\n", name, name, labels, v)
	}
	counter := func(name string, v int64) {
		fmt.Fprintf(&b, "# TYPE %s counter\n%s{%s} %d\n", name, name, labels, v)
	}
	gauge("vllm:num_requests_running", float64(len(s.running)))
	gauge("vllm:num_requests_waiting", float64(len(s.waiting)))
	gauge("vllm:kv_cache_usage_perc", usage)
	gauge("vllm:gpu_cache_usage_perc", usage)
	counter("vllm:num_preemptions_total", s.stats.Preemptions)
	counter("vllm:prompt_tokens_total", s.stats.PromptTokens)
	counter("vllm:generation_tokens_total", s.stats.GenerationTokens)
	s.ttft.write(&b, "vllm:time_to_first_token_seconds", labels)
	s.e2e.write(&b, "vllm:e2e_request_latency_seconds", labels)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
