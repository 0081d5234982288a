// Package fakeprovider is a model provider's stand-in for the invoice
// example's demo and tests: OpenAI's chat completions and Anthropic's
// Messages API, over one set of quotas (and a set of its own for each model
// Config.Models names), and both providers' batch APIs.
//
// It serves POST /v1/chat/completions and POST /v1/messages, each with its
// API's request and answer shapes, usage fields, rate-limit headers and
// error bodies. The "model" is a line parser for the
// example's invoice text layout (Supplier:, IBAN:, "- item | q x p = a",
// Total:, ...): it answers with the extraction as JSON in the message content,
// with an evidence quote per field and usage counted as a quarter of the
// characters, as providers roughly do.
//
// What a real provider does to its clients, it does too, on demand:
//
//   - latency: exponential around Config.MeanLatency (15s, as the DESIGN's
//     scenario) divided by Config.Scale, so demos and tests run fast;
//   - RPM and TPM enforcement: 429 with Retry-After (and retry-after-ms),
//     and on every answer the API's rate-limit headers: OpenAI's
//     x-ratelimit-remaining-/x-ratelimit-reset- (Go durations), Anthropic's
//     anthropic-ratelimit-*-remaining/-reset (RFC 3339 times); a 429 storm
//     on demand (Storm, or StormFromNextCall to start it at the next call);
//   - per-model quotas: a model Config.Models names (the request's
//     "model") has its own RPM and TPM buckets, enforced and reported in
//     the rate-limit headers as the server-wide ones are; any other model
//     takes from Config.RPM and TPM;
//   - faults, by rate (seeded, for the demo) or by a marker in the document
//     text (deterministic, for tests): a call that hangs until the client
//     gives up ("[[fake:timeout-once]]"), malformed JSON ("[[fake:malformed]]",
//     or "-once"), an IBAN that is not in the document
//     ("[[fake:wrong-iban]]") and totals that do not add up
//     ("[[fake:bad-total]]"). A "-once" fault hits the first call for a
//     document only, so a retry succeeds;
//   - faults switched on while it runs: HangNext, MalformNext and FailNext
//     (500) hit the next n calls, Storm refuses everything for a while;
//   - one model failing while the others serve, for routes with
//     fallbacks: StormModel refuses a model's calls with 429 and
//     Retry-After for a while, OutageModel answers them as the API does
//     when it has no capacity (OpenAI: 503 "service_unavailable_error";
//     Anthropic: 529 "overloaded_error"), and Heal(model) ends both. Like
//     Storm's, their durations are wall-clock time, not divided by
//     Config.Scale.
//
// Config.OnCall sees every call, with its API, key and model, once its
// answer is on the wire: the call log a test checks quotas against, and the moment to kill a client that
// has its answer but has not recorded it yet.
//
// # Batch APIs
//
// It serves both providers' batch APIs at the paths, and in the shapes,
// their official Go SDKs call:
//
//   - OpenAI: POST /v1/files (multipart, purpose "batch"), GET and DELETE
//     /v1/files/{id}, GET /v1/files/{id}/content, POST /v1/batches,
//     GET /v1/batches/{id}, GET /v1/batches?after=&limit= and
//     POST /v1/batches/{id}/cancel. The input file is JSONL of chat
//     completions requests; the output file holds the answers with 200,
//     the error file those answered 4xx or 5xx and the requests that
//     expired ("batch_expired") or were cancelled ("batch_cancelled");
//   - Anthropic: POST /v1/messages/batches, GET /v1/messages/batches/{id},
//     GET /v1/messages/batches?after_id=&before_id=&limit=,
//     POST /v1/messages/batches/{id}/cancel and the results_url,
//     GET /v1/messages/batches/{id}/results: JSONL of "succeeded",
//     "errored", "expired" and "canceled" results.
//
// Each request is answered by the same fake model, markers and rates as a
// synchronous call, but at once and outside the RPM and TPM buckets; the
// run-time faults (HangNext, MalformNext, FailNext, Storm, StormModel,
// OutageModel) stay with synchronous calls, and a hang ("[[fake:timeout-once]]", Config.TimeoutRate) becomes
// a 500, there being no client to give up. Two markers are for batches
// only: "[[fake:batch-400]]" and "[[fake:batch-500]]" answer that request
// 400 or 500 with the API's error body.
//
// A create is refused with 400 as the provider refuses it: OpenAI's file
// past Config.OpenAIBatchMaxFileBytes (200 MiB) or
// Config.OpenAIBatchMaxRequests (50,000), with a line that is not JSON, a
// duplicate custom_id, a url other than /v1/chat/completions or a second
// model; Anthropic's batch past Config.AnthropicBatchMaxRequests (100,000)
// or Config.AnthropicBatchMaxBytes (256 MiB), or with a custom_id
// duplicate or outside [a-zA-Z0-9_-]{1,64}. An OpenAI batch that would take
// its model's not-yet-ended batches past Config.OpenAIEnqueuedTokenLimit
// of estimated input tokens is created, then "failed" with
// "token_limit_exceeded", as OpenAI fails it.
//
// No goroutine runs a batch: it progresses when something reads it. It
// completes, all its requests answered, at the first read once
// Config.BatchDelay (10 minutes, divided by Config.Scale) has passed; a
// cancel leaves it "cancelling" ("canceling") until the next read ends it.
// Tests drive the clock: HoldBatches keeps batches running until
// ReleaseBatches, AdvanceBatches completes the oldest n now and
// ExpireBatches ends every running one as its completion window would.
// Config.OnBatchCreate sees each batch created once its id is on the wire,
// and Config.OnBatchRequest (and OnCall, with API "openai-batch" or
// "anthropic-batch") each request answered in a batch.
//
// A document that says "ignore previous rules" makes the fake model obey it, as
// a gullible model would: it adds a "send_to" field and swaps the IBAN for the
// one the text asks for. The example's validation must catch that; model
// output is data.
package fakeprovider
