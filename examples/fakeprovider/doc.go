// Package fakeprovider is a model provider's stand-in for the invoice
// example's demo and tests: OpenAI's chat completions and Anthropic's
// Messages API, over one set of quotas.
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
//   - faults, by rate (seeded, for the demo) or by a marker in the document
//     text (deterministic, for tests): a call that hangs until the client
//     gives up ("[[fake:timeout-once]]"), malformed JSON ("[[fake:malformed]]",
//     or "-once"), an IBAN that is not in the document
//     ("[[fake:wrong-iban]]") and totals that do not add up
//     ("[[fake:bad-total]]"). A "-once" fault hits the first call for a
//     document only, so a retry succeeds;
//   - faults switched on while it runs: HangNext, MalformNext and FailNext
//     (500) hit the next n calls, Storm refuses everything for a while.
//
// Config.OnCall sees every call once its answer is on the wire: the call
// log a test checks quotas against, and the moment to kill a client that
// has its answer but has not recorded it yet.
//
// A document that says "ignore previous rules" makes the fake model obey it, as
// a gullible model would: it adds a "send_to" field and swaps the IBAN for the
// one the text asks for. The example's validation must catch that; model
// output is data.
package fakeprovider
