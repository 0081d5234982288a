// Command chaos is llmq's production acceptance suite (`make chaos`): the
// DESIGN's reliability bar, run against the invoice pipeline as separate OS
// processes under load, with faults injected at random points.
//
//	chaos [-duration 3m] [-rate 3] [-workers 3] [-broker rabbitmq|kafka|postgres] [-seed N] [-rpm 200] [-fault-every 8s]
//
// TestChaos runs a reduced configuration (15s of arrivals, two worker
// processes, each fault kind once) against Kafka (kfake) and RabbitMQ in
// `go test`.
//
// # What it proves
//
// Across one run, with every fault below injected at least once, it checks
// from the database, the fake provider's call log and the ERP's own
// tables that:
//
//   - no job is lost: the distinct jobs the API answered with (202, or 200
//     for a retried request) are exactly the extraction jobs in the
//     database, and every same-key resubmission was answered with its job;
//   - every job is explainable: terminal with finished_at, or live (RUNNING
//     with a lease, READY or RETRY_SCHEDULED with available_at), and every
//     job past READY that is not RUNNING has attempt rows;
//   - no SUCCEEDED result is replaced: results are sampled twice a second
//     and after the run and must never change; a SUCCEEDED job has exactly
//     one succeeding attempt, its last, under its current fence; any other
//     attempt that completed late is recorded as stale;
//   - the ERP's effect happens at most once per job (receipts and bookings
//     per job ≤ 1), exactly once per SUCCEEDED job whose delivery finished,
//     and never for REVIEW_REQUIRED or failed jobs (documents the provider
//     answers with a wrong IBAN must end in REVIEW_REQUIRED);
//   - no completed extraction is paid for twice: a job gets more than one
//     correct answer only where an attempt lost its answer (killed, paused
//     past its lease, uncertain). Where the attempt history shows instead
//     that the handler received and billed an answer and then failed with
//     a retryable error, the report lists it as a defect (see Report);
//     `make chaos` and the CI test fail on defects as on violations;
//   - provider calls per job ≤ its attempts × the candidates each tried
//     (the workers route extractions: the primary model, then a fallback
//     in Anthropic's dialect, invoice.WorkerConfig.Fallback), and every
//     call recorded: per model, a job's calls are its attempts' serving
//     calls and moves (jobs.Attempt.Model, Moves), but for attempts that
//     may have lost their record (their worker killed or paused, hung,
//     uncertain without a candidate), each of which may have called every
//     candidate once; and no 60-second window of one model's calls in the
//     provider's log holds more calls than RPM plus the bucket's burst
//     (RPM/60), nor more tokens than TPM plus its burst (TPM/10): the
//     bound admission documents for its token buckets (each model has its
//     own quota and pool, both of RPM and TPM);
//   - the usage ledger (admission's, written as permits are released),
//     summed over both pools of the route, holds what the provider
//     counted: the usage of every answer the fake
//     provider wrote, less at most that of the answers no worker received.
//     An answer is received when the attempt that made the call records
//     its usage (its permit is released with the same); one is not when
//     its worker was killed on it (the trigger's answer or any other in
//     flight; one that recorded its answer before SIGKILL reached it leaves
//     the ledger whole), or was paused while it was in flight and resumed
//     past its attempt's deadline: it cannot tell an answer that came
//     during the pause from one that came too late, and settles it as an
//     uncertain timeout, without usage (one that resumed in time leaves
//     the ledger whole). Every answer not received must be explained by an
//     attempt of its worker on its job that lost its answer (uncertain
//     without usage, lease expired, stale or hung), and no attempt records
//     more than the provider billed. The workers call the provider with
//     openai-go through provider/openai, which records the usage each
//     answer reports;
//   - the signal path handles every job event exactly once: the outbox
//     relay publishes it, the inbox ingress records it, and its handler's
//     effect (a counter in chaos_signals) is 1 however often the broker
//     redelivers; an event held between commit and ack comes again and is
//     taken as a duplicate (its handler does not run);
//   - no process of the pipeline dies of a fault it should ride out: a
//     child that exits without being told to is a violation, and so is one
//     that does not shut down cleanly when the run ends (under go test the
//     children are the race-enabled test binary, so a data race in a child
//     fails the run).
//
// It prints a progress line every few seconds and a summary table, lists
// each violation and exits 1 if there is any (2 if the run could not be
// carried out).
//
// # How
//
// The controller (this program) runs in one process: the fake provider,
// the invoice API, the ERP, the load generator, the fault injector and, in
// Kafka mode, a kfake cluster. The pipeline's workers and its signal path
// run in child processes: this binary re-executed with -role worker or
// -role signals (the test binary re-executes itself the same way), each
// wired from the invoice package exactly as `invoice -mode worker` does, on
// a schema of the run's own that is dropped at the end. Each child's
// Postgres connections carry an application_name naming it.
//
// Load is open loop: a job arrives every 1/rate seconds whatever the
// pipeline does, each uploaded and submitted through the HTTP API with an
// Idempotency-Key, retried with the same key on errors, a share of them
// submitted again a few seconds later. Every random choice (the load's,
// the schedule's, the provider's latencies) comes from the printed seed;
// process scheduling does not, so a seed repeats the faults and the load,
// not the interleaving.
//
// The faults, each at a random point of the run:
//
//   - worker-kill: the provider's OnCall hook, called once an answer is on
//     the wire, SIGKILLs the worker process that owns the call's API key
//     (each worker has its own) before it can record the answer; a
//     replacement starts with a new key;
//   - worker-stall: the same hook pauses the worker (SIGSTOP) instead, as
//     a long GC pause or a frozen VM would; its leases are ended as if
//     they had run out meanwhile, the reaper takes its jobs back, and it is
//     resumed (SIGCONT) once another worker finished the job whose answer
//     it holds: its completion must be recorded as stale and change
//     nothing;
//   - consumer-stop: the signals process holds the next delivery whose
//     inbox transaction committed, instead of acknowledging it, and is
//     SIGKILLed there (RabbitMQ, Kafka; a replacement starts), or closes
//     its consumer and opens another (the memory broker of -broker
//     postgres, which lives in that process);
//   - broker-cut: every connection to the broker is closed and new ones are
//     refused for a few seconds (a TCP proxy in front of RabbitMQ; the
//     kfake cluster's own listener);
//   - pg-terminate: pg_terminate_backend on a child's backend that is
//     inside a transaction;
//   - 429-storm (every call refused with 429 and Retry-After for seconds),
//     timeouts (the next calls hang until the worker gives up), malformed
//     (the next calls answer malformed JSON): the fake provider's run-time
//     controls;
//   - primary-outage: the primary model alone storms (429 with
//     Retry-After, fakeprovider.StormModel) or is out (503, OutageModel)
//     for 2 to 4 seconds, while the fallback serves: attempts pass the
//     cooling primary over or move to the fallback inside the attempt;
//   - erp-down: the ERP's server goes down for 3 to 5 seconds, longer than
//     the first five steps of the short delivery schedule the run
//     configures: its connections are closed and new ones closed as they
//     arrive (its listener stays bound, so it comes back on the address
//     the endpoint is registered with, which another process could
//     otherwise take in between).
//
// # Decisions and workarounds
//
//   - invoice.WorkerConfig has no lease duration: the invoice worker's
//     leases are at least 90s and its admission permits live 2 minutes. A
//     killed worker's jobs would wait that long for the reaper, longer
//     than the CI test may take. After a kill, once the process is gone,
//     the controller does what a supervisor that saw the process die may
//     do: it ends the dead worker's leases and permits now and runs one
//     reaper pass (jobs.RunnerStore.Reap). A stall ends the paused worker's
//     leases the same way, standing for the time it would have been
//     paused. The lease-expiry path (fence bump, RETRY_SCHEDULED,
//     lease_expired attempt, uncertain usage, stale completion) is the
//     library's; only the waiting is cut short.
//   - A child that exits by itself while running is a violation; one that
//     fails during start-up (its migration's connection terminated) fails
//     fast as it should, is restarted and noted.
//   - The API runs in the controller's process, with connections of its
//     own that are never terminated; the workers' and the signal path's
//     are.
//   - The signal path's handler is the run's own table; the broker
//     carries llmq's job events, and the workers are woken by Postgres as
//     always (lease has no broker wake-up).
//
// # What it does not prove
//
//   - Crashes of Postgres or of the broker themselves (their data
//     survives); the ERP losing its database; clock skew between hosts.
//   - Exactly where in a transaction a backend dies: pg-terminate picks a
//     backend that is in one when pg_stat_activity is read.
//   - A stall of a worker inside a transaction on its own job's row: such
//     a row keeps its lease (the controller skips locked rows), so the
//     stall is retried on another answer.
//   - Anything about latency or throughput: the timing of the run is
//     compressed (a 15s provider latency scaled to 150ms) and the machine
//     is shared.
//   - That a killed worker never committed: the kill is sent while its
//     answer is in flight, and a report note says if a worker recorded its
//     answer first.
//   - Quota fairness between tenants: the load is one tenant's.
package main
