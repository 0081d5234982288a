// Package llmqtype holds the few types that several llmq packages share, so
// that each is defined once, in a public package whose go doc shows it:
//
//   - DBTX, the caller's connection or transaction that every store method
//     runs its SQL on. jobs.DBTX, outbox.DBTX, inbox.DBTX, webhook.DBTX and
//     admission.DBTX are this type.
//   - ValidationError, the error every llmq package returns for bad input.
//     One type for all of them, so one errors.As target matches a bad job
//     parameter, outbox event or webhook endpoint alike; its Kind field is
//     the sentinel of the package that refused the input (for example
//     jobs.ErrInvalidParams), which errors.Is also matches.
//   - NotMigratedError and ErrNotMigrated, what every component answers
//     when its schema has no llmq tables (never migrated, or another
//     schema than the one migrated), naming the schema, the setting that
//     chose it and the command that fixes it.
//   - StatementCacheError and ErrStatementCache, what they answer when the
//     pool's prepared statements do not survive a transaction pooler
//     (pgx's default query exec mode behind PgBouncer before 1.21), naming
//     the fix.
//   - BackoffPolicy, the full-jitter exponential backoff that jobs
//     (ReapParams), lease (Config.Retry), outbox (RelayConfig.Backoff) and
//     broker/rabbitmq (ConnConfig.Reconnect) take.
//
// The package imports nothing else from llmq, so any package can use it.
//
// # Decision: one shared public definition
//
// Before this package existed, jobs, outbox, inbox, webhook and admission
// each exported aliases of internal types, which go doc shows as
// "type X = internal.Y", hiding their fields and methods. The choices were a
// copy per package or one public definition:
//
//   - ValidationError and BackoffPolicy are concrete types that errors.As
//     targets and struct fields must agree on: five copies of
//     ValidationError would need five errors.As calls, so the packages now
//     name llmqtype.ValidationError and llmqtype.BackoffPolicy directly.
//   - DBTX is an interface, so a copy declared in each package would accept
//     the same pools and transactions; but function values would not be
//     interchangeable (a func(context.Context, jobs.DBTX) is not a
//     func(context.Context, outbox.DBTX)), which bites hosts that pass
//     store methods around, as the retention service does. So DBTX too is
//     defined once, here, and each package keeps the short name as an alias
//     of it, documented as such, so that signatures read "db DBTX".
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
