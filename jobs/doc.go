// Package jobs is llmq's job store: durable acceptance with idempotency, the
// job state machine, and tenant-scoped reads.
//
// A host service accepts work by calling Store.Enqueue on its own
// transaction, so the job, its "<kind>.requested" outbox event and the
// host's business write commit together or not at all:
//
//	tx, _ := pool.Begin(ctx)
//	res, err := store.Enqueue(ctx, tx, jobs.EnqueueParams{
//		Tenant:         tenant,              // from the credential, never the body
//		Kind:           "invoice.extract",
//		Payload:        payload,             // ids and options, not the document
//		IdempotencyKey: r.Header.Get("Idempotency-Key"),
//		RequestHash:    hash,                // jobs.RequestHash of what changes the result
//	})
//	...
//	tx.Commit(ctx)
//
// # Guarantees
//
//   - Acceptance is atomic: a job exists if and only if its requested event
//     exists (unless its kind's events are turned off, below), in the same
//     commit as the caller's own writes.
//   - Lifecycle events can be turned off per kind (Config.KindsWithoutEvents),
//     for hosts that run no relay: such a job writes no outbox row at all,
//     in any transition, whichever process makes it (the choice is made when
//     the job is accepted and kept on its row), so nothing waits unpublished
//     and nothing is reported as relay lag. Every other kind keeps all its
//     events, and everything else (state, fences, attempts, idempotency) is
//     the same.
//   - Idempotency per tenant: the same (tenant, idempotency key, request
//     hash) always yields the same job, however many callers race (the
//     unique index decides, not a read-then-write); EnqueueResult.Existing
//     tells a retry from a first acceptance, and no second event is written.
//     The same key with another hash is ErrIdempotencyConflict and writes
//     nothing. Keys live in the job_keys table, written once per job, as long
//     as their row there: a host that deletes old jobs deletes their job_keys
//     rows (and job_attempts and job_steps rows) with them. Pruner.PruneFinished does, in
//     one statement per batch, for finished jobs only (the retention
//     package runs it); once a job is pruned its key accepts a new job.
//   - Bad input is refused before anything is written, with a
//     *llmqtype.ValidationError naming the field (errors.Is ErrInvalidParams, and
//     ErrUnknownQueue or ErrPayloadTooLarge where they apply). A refused or
//     conflicting call leaves the caller's transaction usable. A payload
//     is refused unless jsonb can store it: valid JSON, valid UTF-8, no
//     \u0000 or unpaired surrogate escape, and numbers within numeric's
//     range (encoding/json accepts all of these; PostgreSQL would fail
//     the statement, and the transaction with it).
//   - EnqueueMany is all or nothing: a savepoint inside the caller's
//     transaction, or a transaction of its own on a pool.
//   - A call of one job (Enqueue, or EnqueueMany of one) runs a statement
//     of its own, InsertJob, that writes exactly the rows the batch
//     statement writes for that job, from scalar arguments: its plan has no
//     unnest, joins or batch-row insert to set up, and PostgreSQL spends
//     about two thirds of the time on it (see docs/performance.md).
//   - Config.OnAccept runs in the same transaction after the insert, with
//     the newly created jobs; its error undoes the whole call. This is the
//     seam for acceptance policy this package knows nothing about, such as
//     admission's tenant quotas.
//   - Every read and Cancel is tenant-scoped: another tenant's job is
//     ErrNotFound, exactly like a job that does not exist.
//   - Every change a client can observe bumps the job's state_version, which
//     never goes backwards.
//   - Enqueue NOTIFYs "<schema>_jobs" with the queue name, at most once per
//     queue per Config.NotifyInterval (5ms) from a store; Postgres delivers
//     it on commit, so runners wake for committed work only, and a runner
//     keeps claiming for a while after each wake-up, so an enqueue that sent
//     none is still picked up within milliseconds.
//   - Fencing: a job's fence changes whenever a lease begins (Claim) or ends
//     (Complete, the reaper, a release at shutdown), or its holder gives it
//     up as hung (MarkHung). Heartbeat and Complete
//     apply only under the fence their attempt was claimed with, in one
//     statement per batch, so a worker that lost its lease changes nothing;
//     Complete reports ErrLeaseLost and records the attempt as stale.
//   - Complete writes the job's new state, its attempt row and its outbox
//     event in one statement: "<kind>.completed", ".review_required",
//     ".dead_lettered" or ".cancelled" for terminal states, and
//     ".retry_scheduled" when a failed attempt will be retried (a release at
//     shutdown and a snooze write none). Run it in a transaction to add
//     writes of your own (lease.Config.OnSucceeded does). It returns what
//     it wrote on each job (CompletionResult), never the payload, and the
//     result only when the completion sent none: the caller holds the job
//     as claimed, and CompletionResult.Apply makes the job as recorded of
//     it.
//   - A statement that writes more than one event (EnqueueMany and
//     EnqueueBatch, Complete of several jobs, the reaper's and the deadline
//     sweep's dead letters) writes them as one batch row of the outbox
//     (outbox.Store.WriteBatch's shape, migration 0021): about a sixth of
//     the WAL per event that single-event rows cost, and next to nothing
//     for the relay to publish. A statement of one event writes a
//     single-event row, as before. The relay publishes both in write order
//     per key (see package outbox, Batch rows); whoever reads the outbox
//     table directly reads both tables (outbox.Store.ListByAggregate
//     does).
//   - No job past its deadline is claimed; Reap fails such waiting jobs with
//     class "deadline" and takes back expired leases (fence+1, full-jitter
//     backoff, or terminal when attempts or time are used up). Reap is safe
//     to run from every runner at once.
//   - Replay leaves the finished job untouched and creates a new one linked
//     by ReplayOf, recording who asked and why. It is idempotent per
//     finished job: a second replay (a double click, a retried request,
//     two operators at once) returns the first replay's job with
//     ReplayResult.Existing set and writes nothing; ReplayParams.Again asks
//     for another new job on purpose. The first replay holds a replay key:
//     a job_keys row of the tenant whose key holds a control character, so
//     no key a tenant sends (those are refused) can take it, and the unique
//     index decides between racing replays as it does for Enqueue. The key
//     lives as long as the replay's job_keys row.
//   - One completion cannot fail another's batch for what it holds: Complete
//     refuses a batch before writing anything when a completion fails
//     Completion.Validate (callers validate each first), and makes error
//     texts storable (invalid UTF-8 and NUL bytes become U+FFFD) instead of
//     refusing them. OutputAsResult turns any output into a result the store
//     can keep: JSON as it is, anything else as a JSON string of its text.
//   - MarkHung gives up attempts whose handlers ignore their cancellation:
//     the job's fence moves on at once (the hung handler's completion is
//     then stale), its attempt row says "hung" and uncertain, and the job
//     stays RUNNING until its lease expires, when Reap takes it back with
//     the class "hung" (a primary-key probe of job_attempts per job taken
//     back tells it so).
//   - Move hands a held job to another queue under its fence, runnable at
//     once, its attempt snoozed (not counted against MaxAttempts) with the
//     reason given: a provider batch submitter's way to pass a job whose
//     deadline leaves no room for a batch to synchronous runners. It
//     writes no lifecycle event and NOTIFYs the new queue.
//
// # Fair claiming
//
// Claim shares each batch among a queue's tenants, in one short
// transaction of two statements (see queries.sql for the SQL and the
// indexes each step reads):
//
//   - Weighted fair sharing. Every (queue, tenant) has a virtual time that
//     advances by 1/weight per claimed job; a claim locks the active tenants
//     with the lowest virtual times and offers each job to the tenant whose
//     next job finishes first in virtual time (start-time fair queueing).
//     Backlogged tenants receive claims in proportion to their weights
//     (default 1). A tenant that returns after an idle spell starts at the
//     lowest active virtual time: it is served at once, but banks no credit.
//     A claim locks one tenant for every 16 jobs it may take (at least 4):
//     with many tenants, each is served up to about 16 jobs at a time and
//     they take turns, because every locked tenant's row is written by the
//     claim. Locking a tenant per job cost a tenant-row update per job
//     claimed (13,200 against 19,400 jobs/s on 1,000 tenants, claims of 500).
//   - Caps: TenantLimits.MaxRunning bounds a tenant's RUNNING jobs in a
//     queue across every runner. The tenant's row is locked from the choice
//     to the commit, and its running jobs are counted by a statement that
//     starts after the lock was granted, so two runners cannot both fill the
//     last slot.
//   - Group keys: at most one job of a (tenant, group key) is RUNNING, and a
//     group's jobs start in acceptance (id) order: a grouped job waits while
//     an earlier job of its group waits or runs. A unique index backs this.
//   - Priority without starvation: ClaimParams.LowPriorityShare of each
//     tenant's claims go to its least urgent class with eligible work; the
//     rest go in priority order (0 first).
//   - Limits are data (SetTenantLimits; the empty tenant holds the
//     defaults) and apply to the next claim.
//   - Cost: a claim reads the tenants and jobs it takes, through indexes,
//     whatever the backlog or the number of tenants; a test keeps the plan
//     honest with EXPLAIN.
//   - A stalled claimer does not hold tenants for long. Claims lock their
//     tenants' rows (others skip them) for the claim's two round trips; a
//     claiming process paused in between would keep those tenants from
//     every runner until it woke. The claim's transaction therefore runs
//     with idle_in_transaction_session_timeout set to
//     Config.ClaimIdleTimeout (5s): Postgres ends the stalled session and
//     its locks go with it.
//   - A claim takes no row lock on the jobs it takes (a row lock is a WAL
//     record of its own, about 50 bytes a job): claims of a tenant are
//     serialised by its row, and the claim's update checks each job again
//     as a cancel or the deadline sweep committed beside it left it, so a
//     cancelled job is never claimed. It waits at most 200 ms for a job's
//     row held by another session (an operator's open transaction, say);
//     past that, the store's claims skip locked rows, taking a row lock
//     per job as they used to, for a minute. So a held job holds back only
//     itself, and a claim gives up before PostgreSQL's deadlock detection
//     (1 s by default) would have to. A claim inside the caller's
//     transaction always skips locked rows: a timeout there would abort
//     the caller's transaction.
//
// A tenant found with nothing to run (no eligible job, all held back by
// their groups, or at its cap) is marked idle and leaves the claim's scan.
// A claim that takes some of a tenant's offer but not all leaves it active:
// the next claim finds out whether it has more. So a tenant served as fast
// as its work arrives stays active, and enqueues for it write no tenant row
// and never wait for one another's commits.
// It becomes active again when work arrives for it (Enqueue), when one of its
// jobs finishes (Complete), or at a WakeIdleTenants sweep. A runner sweeps
// every idle tenant once per poll interval, which brings back a tenant whose
// only work was a retry scheduled for later; and it sweeps the tenants idled
// in the last seconds whenever a NOTIFY led to a claim that came up short,
// which brings back at once a tenant whose enqueue committed while a claim
// was deciding it was idle (that claim could not see the job).
//
// # Decisions
//
//   - Ids are UUIDv7: time-ordered (cheap primary-key inserts, keyset
//     pagination by id) and unguessable enough not to be enumerated.
//   - Priority follows Oban: 0 is the most urgent class and the default.
//   - MaxAttempts 0 means the store default (5); explicit values must be 1 to
//     1000. A zero AvailableAt means the database's now(), so producers with
//     skewed clocks still schedule sensibly; DeadlineAt is checked against the
//     producer's clock at enqueue.
//   - An IdempotencyKey without a RequestHash hashes Kind and Payload, so a
//     reused key with another payload is still a conflict.
//   - Cancel of a RUNNING job records the request and leaves the job to its
//     worker: a job is never cancelled underneath the worker that holds it.
//   - A job's tenant, id and idempotency key are also written to job_keys,
//     once, at acceptance; the tenant listing and the idempotency check read
//     them there. Indexed on jobs, they got an index entry for every row
//     version, and a job gets one at every claim and completion: about 20 %
//     of the throughput of a drain.
//   - An attempt's row is written when the attempt ends; a live attempt is
//     described by its job row (Attempt, Fence, LeaseOwner, AttemptedAt), and
//     Attempts lists it last with no outcome. This saves a write per attempt.
//     Events written by the reaper and the deadline sweep get random (v4)
//     ids, since PostgreSQL 15 cannot make UUIDv7s; order events by their
//     sequence, not their id.
//   - Fairness is between tenants first, priority within a tenant's share:
//     one tenant's urgent jobs do not overtake another tenant's turn. With
//     more than two classes, the low-priority share goes to the least urgent
//     class with work, and the classes between it and the most urgent are
//     served in priority order with the rest, so they can wait while both
//     ends are busy.
//   - Caps count per queue: a tenant capped at 5 may run 5 jobs in each
//     queue. Weights apply in each queue separately too.
//   - A claim that finds nothing its runner can run (another build's kinds,
//     say) marks the tenant idle like any other; runners with different
//     kinds should serve different queues, or that tenant's other kinds wait
//     for the sweep.
//   - A grouped job held back by its group is stepped over by the claim's
//     index scan: a tenant whose eligible backlog is mostly one group's tail
//     makes its claims read that tail. Spread such work over groups, or
//     queues.
//   - Statements that change several jobs a runner holds (Heartbeat,
//     Complete, MarkHung and the stale attempts Complete records) send
//     their jobs in id order, whatever order the caller gave, so a
//     runner's heartbeat and its completions, which run at once on the
//     same rows, lock them in one order and cannot deadlock. Rows of
//     tenant_queues are locked in (queue, tenant) order for the same
//     reason.
//   - Heartbeat, Complete, MarkHung and a claim in a transaction of its own
//     plan with sequential scans off, for their own statements only: a
//     setting sent with them in the same round trip, put back after them
//     in a caller's transaction (where a claim plans under the caller's
//     settings). A connection keeps a statement's plan until the table's
//     statistics change, and one made while jobs held a page (a new
//     deployment's first jobs, a queue pruned empty) scanned the whole
//     table on every later run while a burst filled it, until autovacuum
//     analyzed it again, or for the connection's life without autovacuum.
//     Every row they touch is found by a key.
//   - Enqueue expects READ COMMITTED (Postgres' default). Under REPEATABLE
//     READ a key taken by a concurrent transaction surfaces as a
//     serialization failure for the caller to retry.
//   - The error classes handler_defect (a result that is not JSON the store
//     can hold), unrecordable (PostgreSQL refused the outcome) and hung (an
//     attempt given up past its timeout) are set by the runner and the
//     reaper, like timeout and lease_expired. The first two are terminal at
//     once; a hung attempt is retried like an expired lease.
//   - Lookup, DeadLetters, TenantBacklogs, KindBacklogs and
//     AllTenantLimits read across tenants, for operators' tools (cmd/llmq):
//     an operator has a job id, not always its tenant. A server answering a
//     tenant never calls them; the Store interface, which servers use,
//     stays tenant-scoped. UnservedKinds reads across tenants too, for the
//     runners' warning about jobs of kinds they have no handler for.
//
// # Batches
//
// EnqueueBatch accepts up to MaxBatch jobs of one tenant as a batch, in one
// transaction, idempotent per batch key (the same key with the same jobs
// returns the batch already accepted, with its jobs in input order, and
// writes nothing; with other jobs it is ErrBatchConflict). The batch's
// jobs carry no idempotency keys of their own; their UUIDv7 ids increase
// in input order, which is how a repeat reads them back in that order.
//
//   - Progress in constant time. A batch's row holds its total and its
//     finished jobs by outcome (succeeded, review required, failed,
//     cancelled). Every statement that finishes jobs (a completion, the
//     reaper, a passed deadline, a cancel) updates the rows of their
//     batches in the same statement, so Batch is one primary-key probe at
//     any size and its counts equal the jobs' states in every snapshot.
//     Jobs waiting and running are not told apart (Total - Finished):
//     counting them would put a write of the batch's row on every claim.
//   - Exactly one "batch.completed" outbox event (BatchCompletedEvent, keyed
//     by the batch id, on Config.EventTopic), written by the statement
//     whose update brought the finished count to the total. Batch rows are
//     locked in id order after the jobs' own rows, so the statements that
//     finish a batch's last jobs at once, on any runners, take turns on it
//     and one of them finishes it (batches.sql gives the reasoning).
//     ParseBatchCompleted decodes its payload into the finished Batch.
//   - Every lifecycle event of a batch's job carries "batch_id" in its
//     payload, beside job_id, tenant, kind, queue, state, state_version
//     and attempt, so a consumer of the events can follow a batch without
//     reading jobs; events of jobs outside a batch have no such field.
//   - CancelBatch cancels the waiting jobs at once and asks the running
//     ones to stop, as Cancel does for one; the batch finishes when their
//     runners record it.
//   - A replay of a batch's job is a new job outside the batch. A batch's
//     row outlives its jobs: Pruner.PruneBatches deletes finished batches
//     by age (job_batches_finished_idx), and the retention service keeps
//     them for the longest retention of the finished states.
//
// # Result reuse
//
// A job that sets EnqueueParams.Reuse takes an answer already paid for
// instead of computing it again: the result of the newest SUCCEEDED job of
// its kind whose Reuse.Key and scope are its own and which finished within
// its Reuse.TTL. The host builds the key from what determines the answer
// (ReuseKey over the model and its parameters, the prompt's version and a
// digest of the input), so a new prompt version is a new key and results
// of the old one are never reused for it.
//
//   - Scope. A key is the tenant's own unless Reuse.Shared says otherwise:
//     under a tenant key no job of another tenant ever takes the result,
//     which is the right default for anything computed from a tenant's
//     data. Shared keys are one space across tenants, apart from tenant
//     keys (a shared job never takes a tenant job's result, or the reverse).
//   - Sources. Only a job that SUCCEEDED by computing its result is a
//     source: not one that failed, needs review or was cancelled, and not
//     one that itself reused a result, so a result's age is always its
//     computation's and reuse never extends it. A result is reusable while
//     its job is kept (retention prunes SUCCEEDED jobs after 24h by
//     default) and within the TTL of the job that would take it.
//   - What a reused job records. Its claim finds the result, and the
//     runner records the attempt as a success without calling the handler:
//     the attempt's outcome is AttemptReused and Attempt.ReusedFrom names
//     the source, as Job.ReusedFrom does; it costs no provider call, no
//     admission permit and no usage in the ledger. Its lifecycle events and
//     the host's OnSucceeded hook are those of a computed success, so what
//     the host delivers onward (a webhook, a row of its own) is the same.
//   - Coalescing. Jobs of one key never run at once: a claim passes over a
//     waiting job whose key is running (it keeps its place and is claimed
//     once that job finishes), and of several picked by one claim only the
//     first runs. When the running job succeeds, the others take its
//     result; when its attempt fails, one of them runs. A job waits no
//     longer than its DeadlineAt: the deadline sweep fails it, as it fails
//     any waiting job. Claims of one tenant's queue are serialised by the
//     tenant's row, so under a tenant key a key runs once at a time across
//     every runner; under a shared key, two runners claiming for different
//     tenants at the same instant can both find the key idle and both run
//     it (both paid; each result is correct). A provider batch submitter
//     (package providerbatch) claims the same way: while a key's job is in
//     a batch, its other jobs wait for that batch.
//   - Cost. A job without a key pays nothing for any of this (its probe is
//     skipped by a one-time filter, and it is in no index of it). A waiting
//     job with a key costs one probe of jobs_reuse_idx when a claim reads
//     it, which answers both questions: is the key running, and which
//     result to take. The index holds the running jobs with a key and the
//     computed successes, an entry each at claim and at success. Waiting
//     jobs whose key is running are read past, a probe each, as a group's
//     tail is: many copies of one key waiting on it cost their tenant's
//     claims that reading until it finishes.
//   - Invalidation. InvalidateReuse records a cut in time for a kind, one
//     of its keys or one tenant's results: no result whose attempt started
//     at or before it is reused again. It is one row however many results
//     it covers; the results themselves are left as they are, explainable.
//     Jobs that would have reused them compute again, and their results
//     are reused from then on. Retention prunes the row once nothing it
//     covers could be reused (ReuseInvalidationRetention).
//   - A replay (Replay) never reuses and is never a source: it is an
//     operator asking for the work to run again.
//
// # Model routes
//
// A kind with a route (lease.Route) tries its candidates (an admission
// pool, a model and a provider adapter) in order, and moves to the next
// within the same attempt when a call is rate limited, fails with a 5xx,
// times out, cannot reach its provider or overflows the model's context
// window. The store records what happened on the attempt's row, written
// with its outcome by Complete (migration 0026): the candidate that made
// the attempt's last call and its model (Completion.Candidate and Model,
// read back as Attempt.Candidate and Model), and the calls that failed
// before it (Completion.Moves, Attempt.Moves), each with its candidate,
// model, failure class, error and tokens, so an operator sees which
// candidate answered and why the ones before it did not. A durable step
// records the candidate whose call produced its output
// (SaveStepParams.Candidate, Step.Candidate), which a later attempt that
// takes the step does not change. An attempt or step without a route
// leaves these columns NULL and costs nothing more; Completion.Validate
// bounds the names (MaxCandidateLen) and the moves (MaxMoves), and
// Complete cuts a move's error text to MaxMoveErrorLen bytes rather than
// refusing it.
//
// # What a host calls and what a runner needs
//
// PostgresStore implements two interfaces. Store is the host's: Enqueue,
// EnqueueMany, EnqueueBatch, Get, List, Cancel, Batch, CancelBatch, Stats,
// Attempts, Steps and Replay.
// RunnerStore is what lease.NewRunner needs: Claim, Heartbeat, Complete,
// MarkHung, Reap, Leases, WakeIdleTenants, TakeStep, SaveStep and Channel;
// and Move, for a providerbatch.Submitter.
// TakeStep and SaveStep keep durable steps (lease.Step): a step's output
// is stored once per job and name, under the fence of the attempt that ran
// it, and is neither stored nor taken by an attempt whose fence has moved
// on (steps.sql gives the lock reasoning). A host passes its
// PostgresStore to lease.NewRunner and never calls the runner's methods.
//
// # The typed layer
//
// A Kind[A, R] names a kind once, with its arguments' and its result's Go
// types; the same value enqueues (Kind.Enqueue, Kind.Accept, Kind.Params)
// and registers the handler (lease.Handle), so a misspelt kind does not
// compile instead of leaving jobs READY forever:
//
//	var Extract = jobs.NewKind[ExtractArgs, Totals]("invoice.extract")
//	res, err := Extract.Enqueue(ctx, store, tx, tenant, ExtractArgs{DocID: id}, jobs.EnqueueOptions{})
//
// Decisions:
//
//   - Kind is a value, not a method on the arguments' type (River's
//     JobArgs.Kind()): one declaration carries both types, and kinds whose
//     arguments share a type stay distinct. It is generic over the result
//     too, so neither direction is json.RawMessage; the raw API
//     (EnqueueParams, lease.Handler) stays for hosts that want it.
//   - Payloads and results are encoding/json. Decoding ignores unknown
//     fields, so a producer deployed with a new field does not break the
//     handlers still running the old version. A payload that does not
//     decode (or a job of another kind) is a *MalformedPayloadError: the
//     runner fails the job at once with class ClassMalformedPayload, since
//     every retry would read the same bytes.
//   - NewKind does not check the name: a Kind is usually a package-level
//     value, and Enqueue refuses a malformed name naming it.
//   - Kind.Accept is the recipe for a job accepted with the service's own
//     row: write runs on the transaction and returns the arguments (which
//     name the row); on Existing the whole transaction is rolled back, so
//     a retried request leaves no second row. With a key it requires a
//     RequestHash, because the default (a hash of the payload) would hash
//     the fresh row id and make every retry an ErrIdempotencyConflict.
//     The raw Enqueue, which cannot refuse that (a payload hash is right
//     for most jobs), says so in the conflict's message instead
//     (ConflictError.DerivedHash).
//   - The outcome helpers stay in this package, in one place
//     (handler_errors.go: Permanent, RetryAfter, RetryAfterHeader, Snooze,
//     InvalidOutput, NeedsReview); a typed handler returns them as its
//     error, as a raw one does, and Kind.NeedsReview takes its typed
//     result.
//   - Await polls a job until it is terminal: for scripts, examples and
//     tests; a service serving many clients follows the job's outbox
//     events instead.
//
// A store whose schema was never migrated answers ErrNotMigrated (a
// *NotMigratedError naming the schema, llmq.Migrate and `llmq migrate up`)
// instead of PostgreSQL's "relation does not exist", from Enqueue,
// EnqueueMany, Get, List, ListAll, Lookup, Cancel, Attempts, Stats and
// Claim: the calls a new host or an operator makes first. The other
// components answer the same error (llmqtype.ErrNotMigrated, naming their
// own Config.Schema) from their first calls: admission.Postgres.Acquire,
// outbox.Store.Write, outbox.Relay.Drain (and a relay's lease check, in its
// log), inbox.Store.Accept and webhook.Store.Enqueue.
//
// # Observability
//
// RegisterGauges puts the queues' depth on a metric.MeterProvider as
// observable gauges (lease.Runner does it while it runs): llmq.jobs
// ({job}; queue, state = runnable | scheduled | running) and
// llmq.jobs.oldest_runnable_age (s; queue). They are read with Depth at most
// once per GaugeConfig.Refresh (default 15s), whatever the scrape rate.
// Depth counts unfinished jobs only, through jobs_tenant_claim_idx and
// jobs_running_tenant_idx: one index entry per waiting or running job and
// none per finished one. At a backlog of 1M waiting jobs (beside 2M
// finished ones) the index-only scan reads 9,172 pages (72 MB) of
// jobs_tenant_claim_idx, against the 53,600 heap pages (419 MB) a count of
// every row read; on a shared 2-core machine that was 0.8 to 1.8 s. Stats,
// for the same reason, counts finished jobs only within StatsWindow (the
// last minute), through jobs_finished_idx. Finished jobs
// are counted by the runner's llmq.job.duration histogram instead. No label
// holds a tenant or a job id: queues are configured, states fixed.
//
// Enqueue stores the W3C traceparent of the span in its context (if any) on
// each job (Job.TraceParent, column trace_parent) and as the "traceparent"
// header of its requested event and of the event its completion writes, so
// the attempts' spans and the events' consumers continue the acceptance's
// trace.
package jobs
