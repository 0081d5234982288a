// Package lease runs a host's jobs: its Runner claims them, calls the
// handler registered for each kind, and records each attempt's outcome,
// retrying or failing the job as the handler's result says. Every worker
// process of a host runs one, beside the code that accepts jobs (package
// jobs).
//
// It runs jobs under fenced leases: the runner claims jobs in short batched
// transactions, runs their handlers outside any transaction, heartbeats the
// leases it holds, and records each attempt's outcome only under the fence
// the attempt was claimed with.
//
//	runner, err := lease.NewRunner(pool, store, lease.Config{
//		Handlers: map[string]lease.Handler{"invoice.extract": extractor},
//		Queues:   map[string]lease.QueueConfig{"extraction": {MaxWorkers: 30}},
//	})
//	...
//	err = runner.Run(ctx) // returns after a graceful shutdown when ctx ends
//
// # Guarantees
//
//   - A stale worker never overwrites a newer result. Every claim bumps the
//     job's fence; completion, retry scheduling and failure apply only while
//     the job is RUNNING under the attempt's fence. A worker that lost its
//     lease (it paused past it, or its process died) gets jobs.ErrLeaseLost,
//     and only its own attempt row records what it reported, as "stale".
//   - A job never runs in two live attempts of llmq at once: a lease is
//     taken back only after it expired, and expiry bumps the fence. The one
//     exception is a handler that ignores its cancelled context: once given
//     up as hung (below), its job is retried after the lease expires while
//     the hung call may still be running; nothing it reports is applied.
//   - A job whose claim found a result to reuse (jobs.Reuse: the job's
//     ReusedFrom is set) is recorded as a success with that result without
//     its handler being called: no provider call, no admission permit, no
//     usage. The completion is fenced, batched and hooked (OnSucceeded) as
//     any success is; its attempt is recorded as "reused".
//   - A lost lease cancels the handler's context at the next heartbeat
//     (context.Cause is ErrLeaseLost); so does a client's cancellation
//     (ErrCancelRequested), the attempt timeout (ErrAttemptTimeout) and the
//     end of the shutdown grace (ErrShutdown).
//   - Outcomes are durable before the attempt counts as finished: the slot
//     is freed only after the completion transaction committed. Completions
//     are batched into few transactions under load, never delayed when idle.
//   - One job's outcome never affects another's. Each outcome is validated
//     (jobs.Completion.Validate) before it joins a batch; one the store
//     would refuse is replaced by what it stands for: a result that is not
//     JSON jsonb can hold fails its own job as a handler defect (class
//     handler_defect, FAILED_TERMINAL on that attempt, the bytes kept as
//     text in its result). If PostgreSQL still refuses a batch's statement
//     for what it holds, the batch is recorded job by job, and an outcome
//     refused on its own fails its job alone (class unrecordable). Only the
//     database's own trouble holds back a whole batch, which is then tried
//     again (below).
//   - A connection-level error is never recorded as the job's fault: a
//     lost, reset or refused connection, a timeout, a server shutting down
//     or starting (class 08, 57P01, 57P02, 57P03), and the errors a pooler
//     in transaction mode gives pgx's statement cache (26000 "prepared
//     statement does not exist", 42P05 "already exists", 0A000 "cached
//     plan must not change result type") are the database's trouble, and
//     the outcome is tried again as after a lost connection; only what
//     PostgreSQL refuses for what the outcome holds makes it unrecordable.
//     The same holds for an OnSucceeded hook whose statement failed that
//     way: its completion is tried again whole, not counted as the hook's
//     failure.
//   - An outcome in hand is not lost to a database that is away for less
//     than the lease. The runner tries to record it again, with backoff
//     from 100ms to 1s, for as long as the attempt's lease, as last
//     extended, lasts, and for LeaseDuration at most: the lease is still
//     heartbeated while the outcome waits, so a database back within the
//     lease gets the outcome within about a second, and no handler runs a
//     second time. After that (a fenced completion would then be stale
//     once the reaper took the job back), or when Run gives up at the end
//     of its shutdown grace, the outcome is given up, logged, and the job
//     is retried by the reaper when its lease has expired, its attempt
//     marked uncertain.
//   - The raw output given to jobs.InvalidOutput and jobs.NeedsReview is
//     stored as it is when it is JSON, else as a JSON string holding the
//     text, so a REVIEW_REQUIRED (or failed) job shows what the model said.
//   - A hung handler cannot hold its job. An attempt still running
//     HungGrace after AttemptTimeout cancelled its context is given up at
//     the next heartbeat: its lease is no longer renewed, the job's fence
//     moves on and the attempt's row says "hung" and uncertain (its call
//     may have been billed) (jobs.RunnerStore.MarkHung). The lease expires at the
//     latest LeaseDuration after the attempt became hung; then any runner's
//     reaper takes the job back (class "hung") and any runner retries it
//     under a new fence: a job is taken over within AttemptTimeout +
//     HungGrace + LeaseDuration + ReapInterval of its attempt's start, plus
//     a claim. Whatever the hung handler returns later is recorded as
//     stale. Its goroutine keeps its worker slot until it returns, so a
//     runner never runs more than MaxWorkers handlers of a queue at once;
//     the llmq.attempts.hung metric and a warning count such attempts.
//   - Every attempt leaves a row: worker, fence, timings, outcome, error
//     class and message, the next retry time, provider usage, and whether a
//     provider call may have been billed without its answer (uncertain).
//   - The attempt counter never resets. A crashed worker's job is taken back
//     by the reaper (every runner runs one) with a new fence and a
//     full-jitter backoff, or fails when its attempts or time are used up.
//   - Retries are llmq's alone: full jitter U(0, min(cap, base·2^(n-1))),
//     raised to a provider's Retry-After, refused with class "deadline" when
//     the next attempt plus DeadlineMargin would end after the deadline. A
//     retry is a persisted time, never a sleep holding a connection or lease.
//   - Fair claiming (see package jobs): each claim shares its batch among
//     the queue's tenants by weight, within their caps on running jobs and
//     one running job per group key; QueueConfig.LowPriorityShare keeps a
//     share for less urgent work. Every PollInterval the runner sweeps the
//     queue's idle tenants back in when they have work that became eligible
//     (jobs.RunnerStore.WakeIdleTenants).
//   - Work is found without any signal: a runner LISTENs for the store's
//     enqueue NOTIFY and polls every PollInterval as a fallback. Hosts whose
//     job signals travel on a broker call Runner.Wake from their consumer
//     (and may set DisableListen); a wake-up is a hint, read against
//     Postgres, so a lost or repeated one only moves when a claim happens.
//   - A claim whose commit reached Postgres but whose reply never reached
//     the runner (a dropped connection, a timeout during the commit) does
//     not strand its jobs: a third of LeaseDuration after a failed claim,
//     the runner lists the queue's jobs leased to it (jobs.RunnerStore.Leases),
//     and hands back at once those it is not running, as snoozed attempts
//     that say so ("released unstarted"), their retry budget untouched.
//     Leases whose outcome could not be recorded are left to the reaper,
//     which marks them uncertain.
//   - Graceful shutdown: Run stops claiming, lets attempts finish within
//     ShutdownGrace, cancels the rest and releases their jobs at once
//     (RETRY_SCHEDULED, available now) instead of leaving them to expire.
//     Under Config.Admission it then waits (at most 5s) for the limiter's
//     queued releases and give-backs (admission.Postgres.Flush): an
//     acquire cancelled after its cycle took it is granted and given back
//     later, and a process that exited first would leave that slot held
//     until the permit expired. A process can exit when Run returns.
//
// # Decisions
//
//   - Handlers return (result, error); errors say how the attempt ended
//     (jobs.Permanent, jobs.RetryAfter, jobs.InvalidOutput, jobs.NeedsReview),
//     as River's job errors do. A panic is a failed attempt (class "panic")
//     and is retried like a transient error.
//   - A handler that returns success after its job was cancelled keeps its
//     success: the work is done, and discarding it would waste the spend.
//   - A released attempt (shutdown) counts as an attempt; if it was the last
//     one allowed, the job still gets one more, because a release is not a
//     failure.
//   - A snoozed attempt (jobs.Snooze) keeps the attempt counter moving but
//     raises the job's MaxAttempts by one, as River's JobSnooze does, so the
//     retry budget is untouched; its attempt row says "snoozed" and why. The
//     job's deadline still holds.
//   - The invalid-output budget counts only attempts that ended in invalid
//     output: a timeout, a lost lease or a snooze before a malformed answer
//     does not use it up. (They are counted from the attempt history, read
//     only when an answer is invalid; MaxAttempts bounds all retries.)
//   - A runner claims only kinds it has handlers for, so runners of
//     different builds can share a queue during a rolling deploy. Jobs of a
//     kind no runner serves would wait unseen: every Config.UnservedKinds
//     (1 minute) each runner looks for jobs of kinds it has no handler for
//     that have waited that long in its queues and logs a warning naming
//     the kind, the count and the oldest's age (jobs.PostgresStore.
//     UnservedKinds; it looks among the queue's idle tenants, so jobs of a
//     tenant that still has work the runner serves show up once that work
//     is done). llmq stats lists unfinished work by kind too.
//   - A handler defect (a result that is not JSON) and an unrecordable
//     outcome fail the job at once rather than retrying it: the same code
//     would pay the provider again for an answer that cannot be stored. A
//     replay after the fix runs it again.
//   - HungGrace defaults to 10s, or half of LeaseDuration if that is
//     shorter: a handler that honours its context returns within
//     milliseconds of the cancellation, and the grace only covers unwinding.
//     The job is left RUNNING until the abandoned lease expires rather than
//     released at once, so that no other runner starts it while the hung
//     call may still be running within the lease it was given.
//   - With no Logger, warnings and errors go to slog.Default() and lower
//     levels nowhere: a handler defect, a refused outcome, a hung attempt
//     or work no handler serves is never silent because no logger was
//     configured.
//   - If OnSucceeded keeps failing, the success is recorded as a transient
//     failure after a few tries: the job runs again rather than sitting
//     RUNNING until its lease expires. A failure that is the database's
//     (a lost connection) is not the hook's, and does not count. A hook that stalls outside the
//     database cannot hold its jobs' rows (and with them this runner's
//     heartbeats) for longer than a third of LeaseDuration: the completion
//     transaction runs with idle_in_transaction_session_timeout set to
//     that, and the outcome is recorded again after Postgres ends it.
//   - Config.Admission puts provider calls under an admission limiter
//     (package admission): a queue is claimed from only while its pools can
//     grant soon, each attempt holds a permit, waiting for one never holds
//     a lease for more than Admission.MaxWait and never spends an attempt
//     (longer waits snooze), and a provider 429 that says how long to wait
//     snoozes the job for that long. Handlers report the provider's answer
//     with Responded. Turn off provider SDK retries (openai-go:
//     option.WithMaxRetries(0)): llmq owns retries, and an SDK retry is a
//     second call under one permit that neither the limiter nor the
//     attempt history sees.
//
// # Typed handlers
//
// Handle adapts a typed handler of a jobs.Kind to Handler, and Kinds
// collects such registrations into Config.Handlers:
//
//	lease.Config{Handlers: lease.Kinds(lease.Handle(Extract, extract))}
//
// The adapter decodes the payload (a payload that does not decode fails
// the job at once, class jobs.ClassMalformedPayload, without calling the
// handler) and encodes the result (a result that does not encode is a
// permanent failure: the same value would fail on every retry). Kinds
// panics on a kind registered twice, a program error found at start-up.
// Runner.Start runs Run in a goroutine and returns the stop function, for
// hosts and tests without a lifecycle of their own.
//
// # Durable steps
//
// A job that is several paid calls (OCR, extract, validate) runs each as a
// Step, so a retry pays only for the steps that had not succeeded:
//
//	text, err := lease.Step(ctx, "ocr", func(ctx context.Context) (OCR, error) {
//		return ocr(ctx, doc)
//	})
//	if err != nil {
//		return nil, err // as it is: it says how the attempt ends
//	}
//
// What a step promises:
//
//   - A step runs at most once to success per job. When its function
//     returns, the output is stored for the job (table job_steps) under the
//     attempt's fence, and every later attempt gets the stored output back
//     without calling the function. Steps are identified by name within
//     their job; a replay is a new job and runs every step again.
//   - A stale attempt neither reuses nor stores a step: both statements
//     read the job's row with the attempt's fence FOR SHARE, which
//     serialises them with whatever moves the fence (jobs.RunnerStore.TakeStep,
//     SaveStep). Step then returns an error wrapping jobs.ErrLeaseLost.
//   - At most once to success, not exactly once: a step whose function
//     returned but whose process died before the store committed runs
//     again on the next attempt. A store that fails for the database's
//     trouble (a lost connection, a restart, a pooler's statement errors)
//     is tried again, with backoff up to a second, for as long as the
//     attempt lasts (its timeout, and its lease); an output the store
//     refuses (not JSON jsonb can hold, over
//     jobs.MaxStepOutputBytes) fails the job at once.
//   - The history says which attempt ran each step and which later
//     attempts reused it (jobs.Store.Steps; Step.Attempt and ReusedBy), and
//     each step keeps the usage it recorded. An attempt's usage counts the
//     steps it ran, never the ones it reused.
//   - A step can take a permit of its own pool (StepWith with
//     StepConfig.Admission), waited for and settled like an attempt's; a
//     long wait snoozes the job and keeps the steps already stored.
//   - A step costs one statement before its function runs (a read, which
//     writes only when a later attempt reuses the step) and one insert
//     after it, on the runner's shared connections.
//   - Decisions: a step's output goes through JSON both ways, so the
//     attempt that ran it and those that reuse it see the same value.
//     Steps are named by the handler, where Temporal and DBOS identify a
//     step by its position in the execution: a retry may run a newer build
//     of the handler (a deploy between attempts), and a name keeps its
//     step's identity when steps are added or reordered, a position would
//     not. There is no determinism rule: code between steps runs again on
//     every attempt, so keep what costs money inside steps.
//
// # Model routes
//
// Admission.Routes gives a kind an ordered list of candidates (Route,
// Candidate): each an admission pool, a model and the client of its
// provider (provider/openai's or provider/anthropic's Client, or a host's
// own Adapter). One handler serves every candidate: CandidateOf(ctx) says
// which one the call is for, and the handler asks its Model through its
// Adapter.
//
//	Routes: map[string]lease.Route{"invoice.extract": {Candidates: []lease.Candidate{
//		{Pool: "openai-gpt", Model: "gpt-4.1-mini", Adapter: openaiClient},
//		{Pool: "anthropic-haiku", Model: "claude-haiku-4-5", Adapter: anthropicClient},
//	}}},
//
// What a route promises:
//
//   - An attempt takes the first candidate whose pool grants a permit
//     within Admission.MaxWait; a pool cooling down after a 429, or out of
//     its RPM, TPM or in-flight budget for longer, is passed over without a
//     call. With none left the job is snoozed for the soonest wait, not
//     counted against its attempts, as a job without a route is.
//   - When the first candidate grants, routing costs nothing: the attempt
//     makes the one acquire an attempt without a route makes.
//   - A call that fails in a way Route.MoveOn names (default: 429, 5xx,
//     timeout or lost connection, unreachable provider, context window)
//     moves the attempt to the next candidate at once, inside the same
//     attempt, under the same lease and context: never past the attempt's
//     timeout or the job's deadline, never another attempt of the retry
//     budget. Invalid output, a refusal, a 400 for the request and the
//     handler's own errors never move it.
//   - Every call holds its own permit, settled with its own usage, so the
//     usage ledger has each call under its candidate's pool (a pool has one
//     price and serves one model). The attempt records the candidate and
//     model that made its last call and each call that moved on before it,
//     with its failure, error and usage (jobs.Attempt.Moves); a durable
//     step records the candidate that produced it.
//   - Route.Pin names one candidate every attempt uses, with no fallback,
//     for results that must come from one model.
//   - NewRunner refuses an empty route, a candidate without a pool, model
//     or adapter, one pool serving two models, and a route of a kind
//     without a handler, naming each. A pool the limiter does not know is
//     refused by Run before its first claim (NewRunner takes no context
//     and does no I/O): Run returns at once with an error naming it.
//
// Decisions: moving is decided by how the call ended as the runner saw it
// (lease.Responded's status, NotSent, the adapters' ErrContextWindow),
// not by the handler; a handler without an adapter reports its responses
// with Responded for moves to happen, and wraps an error of its own that
// is no call's (a document it could not read) with NotSent, or the error
// reads as a call lost after sending and moves the attempt as a timeout. A reuse key (jobs.Reuse) should not
// name the model when a route may serve the job from another: the answer
// is the route's. Provider batches (package providerbatch) are submitted
// to their own pool, outside routes. The metric llmq.route.calls counts
// each candidate's part by result: served, failed, moved_<failure>, or
// passed (no permit within the wait).
//
// # Connections
//
// A runner's use of the database is bounded by a constant, whatever
// MaxWorkers, the number of queues or the load:
//
//   - Claims, completions, durable steps' reads and stores, and the chores
//     (the reaper, the idle-tenant sweeps, the unserved-kinds check,
//     reading an attempt history when an answer is invalid, reading this
//     runner's leases after a failed claim) share 2 connections of the
//     pool: each statement or transaction holds
//     one of them while it runs, and waits for one when both are busy.
//     Completions are batched, so 100 workers finishing at once take one or
//     two transactions, not 100.
//   - Heartbeats, one statement for every lease the runner holds, and the
//     marking of hung attempts run in one goroutine of their own: 1 more
//     connection of the pool at most. Within the runner they never wait
//     behind a completion or a claim, and live leases are renewed before
//     hung attempts are marked. On a pool shared with other components
//     and smaller than the sum of their bounds, a heartbeat may still
//     wait in the pool for a connection another component holds, for as
//     long as that component's statement runs; LeaseDuration is long (90s
//     by default, with a heartbeat every LeaseDuration/3) so that such
//     waits never cost a lease.
//   - LISTEN holds 1 connection of its own, outside the pool, for as long
//     as Run runs (none with DisableListen).
//   - With a MeterProvider, reading the queue gauges takes 1 connection of
//     the pool at most once per GaugeRefresh (none with NoQueueGauges).
//
// So a runner holds 1 connection and uses at most 3 of its pool at once
// (4 while the gauges are read). Size the pool for what else the process
// runs beside it; a pool smaller than 3 still works, the runner's
// statements then wait for each other. Config.Admission's limiter talks to
// the database through the pool it was built with, under its own budget
// (package admission): with a Postgres limiter, count its connections too.
//
// # Connection poolers
//
// The runner's statements, and the store's, keep no state from one
// transaction to the next (settings are transaction-local, advisory locks
// transaction-scoped, no temporary tables), so a runner works on a pool
// behind PgBouncer in transaction pooling mode, in pgx's exec,
// simple-protocol and cache-describe query exec modes, and in its default
// mode where the pooler keeps prepared statements (PgBouncer 1.21 or
// later with max_prepared_statements). Such a pooler cannot carry LISTEN:
// set DisableListen, and the runner finds work by polling, every
// PollInterval (1s by default), or when Wake is called. In pgx's default
// mode behind a pooler that does not keep prepared statements, calls fail
// with an error matching llmqtype.ErrStatementCache that names the fix.
// docs/operations.md ("Connection poolers") says how to choose the mode.
//
// # Observability
//
// With Config.MeterProvider the runner reports, without tenant or job id
// labels:
//
//   - llmq.attempts ({attempt}; queue, kind, outcome, error_class): each
//     attempt as its row records it (succeeded, retry_scheduled, failed,
//     review_required, cancelled, released, snoozed; stale when the lease
//     was lost, unrecorded when recording failed). A handler defect or an
//     unrecordable outcome is "failed" with error_class handler_defect or
//     unrecordable.
//   - llmq.attempt.duration (s; queue, kind, outcome): handler run time.
//   - llmq.job.duration (s; queue, kind, state): from acceptance to the
//     terminal state, for jobs an attempt finished.
//   - llmq.claim.duration (s; queue), llmq.claimed ({job}; queue): claim
//     transactions and what they took.
//   - llmq.complete.duration (s): completion transactions (a batch each).
//   - llmq.reaped ({job}; result = rescheduled | lease_failed |
//     deadline_failed): the reaper's work.
//   - llmq.attempts.hung ({attempt}; queue, kind): attempts given up
//     because their handler ran HungGrace past AttemptTimeout.
//   - llmq.admission.wait (s; pool, result = granted | snoozed | failed):
//     time an attempt waited for its admission permit.
//   - llmq.route.calls ({call}; kind, candidate, result = served |
//     failed | failed_<failure> | moved_<failure> | passed): each route
//     candidate's part in attempts (see Model routes).
//   - the store's queue gauges (jobs.PostgresStore.RegisterGauges), while
//     Run runs, refreshed at most every GaugeRefresh; NoQueueGauges leaves
//     them to another process.
//
// With Config.TracerProvider each attempt is a span "llmq.attempt <kind>"
// (kind consumer), a child of the span that accepted the job when the job
// carries its trace context (jobs.Job.TraceParent), with attributes
// llmq.job.id, llmq.job.tenant, llmq.job.kind, llmq.job.queue,
// llmq.job.attempt, llmq.job.fence, then llmq.attempt.outcome,
// llmq.job.state and error.type. The handler's context holds that span, so
// its own spans (HTTP calls to the provider) nest under it.
//
// Every log line about an attempt carries job, tenant, kind, attempt and
// fence; a handler logs with the same attributes through Logger(ctx).
package lease
