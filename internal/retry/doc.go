// Package retry holds llmq's retry arithmetic: full-jitter exponential
// backoff (Policy, defined as llmqtype.BackoffPolicy so that public packages
// can take it) and Retry-After parsing. Every llmq package that retries (the
// lease runner, the outbox relay, webhook delivery and others) uses it.
//
// One layer owns retries: llmq. Provider SDKs and HTTP clients underneath a
// job should be configured not to retry, because nested retry loops multiply
// (three SDK attempts inside five job attempts is fifteen calls) and hide the
// attempt count that backoff and MaxAttempts are computed from.
//
// The package is pure arithmetic: no clocks, no sleeping, no global random
// source of its own. Callers pass the current time and a random draw, so the
// scheduling decisions that depend on them are reproducible in tests.
//
// # Guarantees
//
//   - Policy.Ceiling is min(Cap, Base·2^(attempt-1)) and never overflows,
//     whatever the attempt number; attempt numbers below 1 count as 1.
//   - Policy.Delay lies in [0, Ceiling): full jitter spreads the retries of
//     jobs that failed together (a provider outage) instead of bunching them
//     at the same instants.
//   - Policy.Next never schedules earlier than a server's Retry-After asks,
//     and never later than MaxRetryAfter because of one: a valid Retry-After
//     raises the delay, never lowers it.
//   - On bad input nothing panics. A policy with negative fields (which
//     Validate reports) yields a zero delay rather than a negative one; an
//     injected random function that strays outside [0, 1) is clamped into
//     it. ParseRetryAfter and ParseRetryAfterMS report an empty, malformed,
//     negative or non-finite value as (0, false), so the caller falls back
//     to plain backoff, and clamp huge values to MaxRetryAfter instead of
//     wrapping around.
package retry
