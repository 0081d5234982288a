// Package localserver is a local inference server's stand-in (vLLM and
// the like) for llmq's examples and benchmarks: an OpenAI-compatible chat
// completions endpoint whose latency comes from a KV cache of a fixed size
// shared by the requests it runs at once, the way a GPU's is.
//
// The model of the server, one engine loop as in continuous batching:
//
//   - A request needs KV cache for its prompt (a quarter of its text's
//     bytes, in tokens) and one more token for each token it generates
//     (Config.OutputTokens, at most the request's max_tokens). It is
//     admitted from the waiting queue, first come first served, when the
//     free cache holds what it has so far, and at most Config.MaxRunning
//     run at once. Admission looks at what a request needs now, not at its
//     max_tokens, as vLLM's does: a server can admit more than its cache
//     can finish.
//   - Each engine step generates one token for every running request and
//     lasts Config.DecodeStep, plus Config.PrefillPerToken for every prompt
//     token of the requests admitted in it (their prefill).
//   - When the running requests' next tokens do not fit the cache, the
//     latest admitted one is preempted: its cache is freed, it goes back
//     to the head of the queue, and when it is admitted again it is
//     prefilled again, prompt and generated tokens both (recomputation).
//     So an overcommitted server spends its time recomputing, and its tail
//     latency grows the way a real server's does.
//
// GET /metrics exposes the engine in Prometheus text format, with vLLM's
// names: vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc (and its older name vllm:gpu_cache_usage_perc;
// a fraction from 0 to 1), vllm:num_preemptions_total,
// vllm:prompt_tokens_total, vllm:generation_tokens_total and the
// histograms vllm:time_to_first_token_seconds and
// vllm:e2e_request_latency_seconds.
//
// Degrade shrinks the cache while the server runs (another process took
// GPU memory, a fragmented cache), for tests of admission's feedback from
// these metrics. Every time is divided by Config.Scale, so a test runs in
// seconds what a GPU runs in minutes. The answer's content is the invoice
// example's extraction (fakeprovider.Extract), so the invoice worker can
// run against it. Generate runs a request through the engine without
// HTTP, for a front of the host's own: the demo's -provider local puts
// the fake provider's API, quotas and faults in front of it
// (fakeprovider.Config.Latency).
package localserver
