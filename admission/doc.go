// Package admission keeps a host's provider calls within the quota all its
// processes share, and its tenants within their acceptance quotas. The lease
// runner takes a permit from it before each provider call
// (lease.Config.Admission), and the job store asks its Quotas at acceptance
// (jobs.Config.OnAccept).
//
// A provider's quota is kept for a pool (the provider project or model
// deployment whose quota every process shares, never the pod): requests per
// minute, tokens per minute, calls in flight and, for local inference
// servers, the tokens those calls hold, taken together.
//
// # Contract
//
// Limiter.Acquire takes one request unit, a token reservation and an
// in-flight slot from a pool, all or nothing. A denial takes nothing and
// returns a *WaitError (errors.Is ErrWait) carrying how long to wait and the
// dimension that denied; a request reserving more tokens than the pool's
// token burst is a *NeverAdmissibleError, since no wait would admit it.
// Permit.Release reconciles the reservation with what happened:
//
//   - CallNotSent: the call never left the process; everything is refunded.
//   - CallAnswered: the request unit is spent; the reservation minus the tokens
//     the provider reported is refunded (a negative refund, when the
//     provider used more, is a debt that delays later grants). A pool with
//     ChargeReserved, for providers that count max_tokens, refunds nothing.
//   - CallUncertain: sent, then a timeout, a 5xx, a 429 or a lost connection.
//     The request unit is spent and, unless the pool has RefundUncertain,
//     the whole reservation too; the caller marks its attempt uncertain.
//
// An uncertain release frees its in-flight slot at once, although a
// provider may still be working on a call its client gave up on (a
// timeout): until the provider notices, such calls can take the provider's
// concurrency above MaxInFlight. Keep attempt timeouts above the
// provider's latency, or MaxInFlight below the provider's limit by the
// number of calls expected to time out at once.
//
// # In-flight token budget (local inference)
//
// A pool may also bound the tokens its calls in flight reserve together
// (Pool.MaxInFlightTokens): the KV-cache budget of a local inference
// server (vLLM and the like), where twenty 80,000-token contexts weigh on
// the GPU as twenty 1,000-token ones do not, though each takes one slot.
// A request's Tokens (its prompt plus its max output) are reserved against
// the budget with its slot, all or nothing with the other dimensions, and
// come back whole when the permit is released or reaped: the budget
// measures what is held while a call runs, not what it used, so reported
// usage reconciles the token bucket only. A denial for it is ReasonInFlightTokens,
// waited out like an in-flight denial (InFlightRetry); a request larger
// than the budget is a *NeverAdmissibleError naming it. Both limiters keep
// it; the Postgres limiter keeps it across processes on the pool row, in
// the same statements as the in-flight count (migration 0017). 0, the
// default, is no such limit.
//
// A provider's 429 or 503 with Retry-After (seconds, HTTP-date, or
// retry-after-ms) sets a pool cooldown that every holder obeys: Observe
// reads the response and applies it. OpenAI's x-ratelimit-* and
// Anthropic's anthropic-ratelimit-* headers can only lower the buckets,
// never raise them, and a budget reported as 0 cools the pool down until
// its reset.
//
// # Postgres limiter
//
// One row per pool holds every dimension: lazily refilled request and
// token buckets, the in-flight count and the cooldown. Every grant and
// every release changes that row under its lock, so the limits hold across
// processes; queries.sql explains why each statement is race-free under
// READ COMMITTED.
//
// Acquirers and releasers are served in cycles, so a hot pool costs about
// one round trip per process per cycle, not one per waiter. In each
// process, Acquire and Release queue their request on the pool's local
// queue, in arrival order. One cycle at a time per pool takes the queue's
// head (up to 256 acquires and 1,024 releases) and runs it as one
// transaction in one round trip: settle the releases (their refunds and
// freed slots serve the same cycle), lock the pool row, then grant the
// longest prefix of the acquires that the pool can grant together, each
// all or nothing, and insert their permit rows. Work that needs no lock
// (deleting released permits, planning) is done before the lock is taken,
// so other processes wait for as short a time as possible. First come,
// first served among a cycle's waiters: a request is never granted ahead
// of an earlier one that was denied, so a large reservation is not overtaken by later
// small ones (a request larger than the token burst is refused and blocks
// nobody). Waiters that arrive while a cycle runs wait for the next one,
// holding no connection. A cycle's transaction commits whole or not at
// all: if it fails, nobody in it is granted anything and no release in it
// happened. A cycle of a single acquire, or of a single release, runs as
// one statement instead (the lone caller's path stays as short as it was).
//
// Each acquire gets the verdict of the cycle it was in: a permit, or a
// *WaitError computed from the pool's state after the cycle (a request
// denied only because an earlier one in the cycle was gets that request's
// wait). Acquire waits for its cycle, never for budget to refill; lease's
// runner sleeps out short waits and snoozes long ones.
//
// Across processes, cycles queue on the pool row's lock, which Postgres
// grants in turn, so every process with waiters gets a cycle in every
// round; the group bounds keep each cycle, and so each turn, short. No
// process starves while others are served.
//
// A waiter's own context ends only that waiter: it takes nothing. Still
// queued, it leaves the queue. Already in a running cycle, it returns at
// once, and whatever the cycle grants it is given back as never sent, in
// a later cycle. Flush waits for such give-backs before a process exits;
// lease's runner calls it when Run ends, and a host that acquires outside
// a runner calls it itself.
//
// A cycle whose connection is lost (pg_terminate_backend, a restart, a
// broken socket) is tried once more on another connection with the same
// permit ids; a permit the first try committed is found and reported, not
// granted twice, and a release already applied deletes nothing the second
// time. A cycle whose outcome stays unknown (no answer within Timeout) has
// every permit it may have granted given back as never sent.
//
// Permits are rows with an expiry. A holder that dies never releases; once
// its permit expires, the next cycle that is short of slots (or Reap)
// deletes it and returns its slot. Release and the reaper both start by
// deleting the permit row, so exactly one of them adjusts the pool. An expired permit's tokens and request are not refunded: its call
// may have reached the provider. PermitTTL must therefore exceed the
// longest call: the runner's attempt timeout.
//
// Pool limits are data: SetPool changes them for every process at once,
// keeping current levels clamped to the new bursts.
//
// Limiter cycles commit with synchronous_commit off, for their own
// transaction only. A pool row's lock is held until commit; waiting for a
// WAL flush per cycle would cap a hot pool at the disk's flush rate. The
// cost: if Postgres itself crashes, the last few hundred milliseconds of
// limiter writes (at most 3 × wal_writer_delay) may be lost, which can
// re-grant budget that calls already used, once.
//
// # Connection budget
//
// The Postgres limiter holds no connection of its own: it borrows from the
// DBTX it is given, one connection per statement or cycle, and gives it
// back at once. It runs at most Config.MaxConns statements at once
// (default 4, DefaultMaxConns), whatever the number of waiters and
// whatever the runner's MaxWorkers: one cycle at a time per pool with
// queued work, and reads (State, Ready, Pools, Usage, Counts) and writes
// (SetPool, Cooldown, LowerRemaining, Reap), all sharing those slots. With
// one hot pool it uses one connection at a time for its cycles. Size the
// pool passed in for MaxConns plus whatever else uses it.
//
// # Contention is not an outage
//
// Every cycle sets lock_timeout to half of Config.Timeout, so a pool row
// held too long by others comes back as an error from the server, not as a
// client timeout. Lock timeouts, deadlocks and serialization failures are
// reported as a *WaitError with ReasonContention and a 5ms wait, as is a
// denial the pool's state no longer explains. ErrUnavailable and the
// failure policy are only for a database that cannot be reached: a lost
// connection, a server shutting down or refusing connections, or no
// answer within Timeout.
//
// A release is never dropped for contention. The releases of a cycle that
// failed for any reason are queued again, after a pause that doubles from
// 25ms up to 1s, until they succeed, have failed 8 times, or their permit
// expired (its slot then comes back through the reaper). Releasing is
// idempotent by permit id, so repeating one whose outcome was lost is
// safe. Release returns only the final outcome; if its caller's context
// ends first, the retries go on without it, and Flush waits for them.
//
// # Local limiter
//
// Local has the same contract for one process: x/time/rate buckets plus a
// counting semaphore under one mutex. It is also the basis of the
// emergency allowance.
//
// # When the database is unreachable
//
// Config.OnUnavailable decides. The zero value fails closed: Acquire
// returns ErrUnavailable and nothing is admitted. A FailurePolicy with a
// Fraction and a For lets each process admit from a local limiter holding
// that fraction of the pool's limits, for at most For from the first
// failure of an outage; its doc states the worst-case overshoot. Errors
// that are answers (a denial, an unknown pool) are never treated as an
// outage, nor is the caller's own cancellation, nor contention.
//
// # Logging
//
// Config.Logger receives the limiter's warnings and errors; without one
// they go to slog.Default(), so they are not lost in a deployment that
// configured nothing. It logs, once each, the start of a time the database
// cannot be reached (Error, with the policy in force) and its end (Info);
// a cycle that waited past the lock timeout (Warn); and give-backs that
// failed, whose permits expire instead (Warn).
//
// # Runner integration
//
// Package lease uses this package (lease.Config.Admission); this package
// never imports lease. The runner claims from a queue only while one of its
// pools is Ready within a short wait, takes a permit per attempt, turns
// long waits and unreachable limiters into snoozes (the attempt is not
// counted), and turns a provider 429 that carries a wait into a snooze for
// that wait. A 429 without any wait counts as an ordinary transient
// failure, so a provider that refuses without saying when cannot keep a
// job forever; the job's deadline bounds snoozes too.
//
// # Tenant acceptance quotas
//
// Quotas bound, per tenant, pending jobs, pending payload bytes, pending
// estimated tokens and the day's spend, and bound all tenants' pending jobs
// together. Its Hook goes in jobs.Config.OnAccept, so the check runs inside
// the enqueue transaction after the insert: a refusal (a *QuotaError with
// status 429 for a tenant quota, 503 for system capacity, and a
// Retry-After) rolls back everything the enqueue wrote, and a retried
// enqueue of an already accepted job (same idempotency key) is never
// refused. Work that was accepted is never dropped by a quota. An advisory
// lock per tenant serialises the check, so concurrent enqueues cannot pass
// a tenant quota together; the system bound is counted without a lock and
// may be passed by concurrent batches.
//
// # Usage ledger
//
// Release adds each sent call of a permit with a tenant to a ledger per
// tenant, pool and UTC day: attempts, uncertain attempts, reported input
// and output tokens, and cost at the pool's prices. It is built from
// reported usage, never from reservations. A permit that expired with its
// holder is not in the ledger (the attempt history records it as
// uncertain). Each key is spread over a few shard rows so a busy tenant's
// releases do not queue on one row lock; Usage sums them.
//
// Requests served through a provider's batch API take no permit; their
// results are added by BatchLedger (package providerbatch calls it in the
// transaction that applies them) as attempts and BatchAttempts, costed at
// the pool's BatchInputPrice and BatchOutputPrice, half the synchronous
// prices when left at zero.
//
// # Decisions
//
//   - Buckets are token buckets: any window of w seconds holds at most
//     RPM/60·w + RequestBurst grants (by the grant times in
//     Permit.Acquired), plus one for each CallNotSent release, which gives its
//     unit back. RequestBurst
//     defaults to one second of RPM; TokenBurst to TPM/10, which is also
//     the largest request a pool admits.
//   - An in-flight denial reports InFlightRetry (50ms) as its wait: when a
//     slot frees is not predictable. Runners do not claim for a pool whose
//     slots are all held.
//   - A denial the pool's state no longer explains is reported as
//     ReasonContention with a 5ms wait, so a crowd of callers does not
//     spin on the database.
//   - A cycle's releases are added together and clamped at the bursts
//     once: the same as applying them one by one with the debts first
//     (concurrent releases have no order anyway). Their ledger rows go to
//     one shard per cycle, picked by its first permit's id.
//   - A single statement, or a pipelined transaction per cycle, rather
//     than a stored procedure: no function to migrate, and the SQL stays
//     in queries.sql with its lock reasoning.
//   - A 429 or 503 cools the pool down only when it says how long (or an
//     exhausted budget says when it resets); a bare 429 leaves the pool to
//     the buckets.
//   - Permits default to a two-minute TTL: longer than the runner's
//     default attempt timeout of 45s.
//
// # Retries
//
// llmq owns retries. Turn off every SDK's own retries (for openai-go,
// option.WithMaxRetries(0); for anthropic-sdk-go likewise), or one attempt
// would make several provider calls under one permit, invisible to the
// limiter and to the attempt history.
//
// # Observability
//
// With Config.MeterProvider the Postgres limiter reports
// llmq.admission.acquires ({request}; pool, result = granted | emergency |
// denied | never_admissible | unavailable | error, and reason on denials:
// cooldown, in_flight, requests, tokens, contention),
// llmq.admission.cooldowns ({cooldown}; pool), and
// llmq.admission.tokens.reserved and llmq.admission.tokens.used ({token};
// pool): what grants reserved against what providers reported on release.
// Pools are configuration, so the label is bounded; an acquire for a pool
// the limiter does not know (result error) carries no pool label. The time
// attempts wait for a permit is the runner's (lease: llmq.admission.wait).
// The Local limiter reports nothing: it serves one process, whose runner
// already reports its waits.
package admission
