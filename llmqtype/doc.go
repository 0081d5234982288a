// Package llmqtype holds the few types that several llmq packages share, so
// that a host names each of them once and go doc shows their definitions:
//
//   - ValidationError, the error every llmq package returns for bad input.
//     One type for all of them, so one errors.As target matches a bad job
//     parameter, outbox event or webhook endpoint alike; its Kind field is
//     the sentinel of the package that refused the input (for example
//     jobs.ErrInvalidParams), which errors.Is also matches.
//   - BackoffPolicy, the full-jitter exponential backoff that jobs (Reap),
//     lease (Config.Retry), outbox (RelayConfig.Backoff) and
//     broker/rabbitmq (Config.Reconnect) take.
//
// The package imports nothing else from llmq, so any package can use it.
//
// # Decision: what is shared and what is declared per package
//
// Before this package existed, jobs, outbox, inbox, webhook and admission
// each exported aliases of internal types (DBTX, ValidationError,
// BackoffPolicy), which go doc shows as "type X = internal.Y", hiding their
// fields and methods, and which a host cannot name in its own code.
//
//   - Concrete types that errors.As or struct fields must agree on
//     (ValidationError, BackoffPolicy) are defined once, here. Five copies of
//     ValidationError would need five errors.As calls.
//   - DBTX, the connection-or-transaction seam, is an interface declared in
//     each package that takes one (jobs.DBTX, outbox.DBTX, ...). Interfaces
//     are structural: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy every one
//     of them, and a value of one package's DBTX can be passed to another's,
//     so the copies cost a host nothing while go doc of each package shows
//     the methods it needs.
//
// # Guarantees
//
//   - BackoffPolicy.Ceiling is min(Cap, Base·2^(attempt-1)) and never
//     overflows; Delay lies in [0, Ceiling); Next never schedules earlier
//     than a server's Retry-After nor later than MaxRetryAfter because of
//     one. A policy with negative fields (which Validate reports) yields a
//     zero delay, never a negative one.
//   - ValidationError matches, with errors.Is, both its Kind and its Cause.
package llmqtype
