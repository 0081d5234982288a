// Package retention keeps llmq's tables bounded: a maintenance service that
// deletes what the host no longer needs, so a long-lived deployment holds
// a steady amount of history and its cost per job does not drift.
//
// Run a Service in every runner process, beside the lease.Runner and the
// outbox relay:
//
//	svc, err := retention.New(pool, retention.Config{Schema: "llmq"})
//	...
//	go svc.Run(ctx) // returns when ctx ends
//
// # What is pruned, and when (Policy; defaults)
//
//   - Finished jobs by state, with their job_attempts rows, their stored
//     steps (job_steps) and their job_keys rows (idempotency keys, the tenant listing, and a replay's
//     replay key): SUCCEEDED after 24h, CANCELLED after 7 days,
//     REVIEW_REQUIRED and FAILED_TERMINAL (dead letters) after 30 days,
//     counted from the job's finish. People act on review and dead letters,
//     so they are kept longer, as River keeps its cancelled and discarded
//     jobs longer. Never keeps a state forever. A waiting or running job is
//     never pruned, however old.
//   - Finished batches (jobs.EnqueueBatch) after the longest of those four
//     retentions (30 days by default), counted from the batch's finish, so
//     a batch's row outlives every job it counted; kept forever when any
//     of the four is Never.
//   - Reusable results (jobs.Reuse) are the SUCCEEDED jobs themselves:
//     pruning a job ends its result's reuse. An operator's invalidation
//     of reused results (job_reuse_invalidations) is kept while a result
//     it covers could still be reused: the SUCCEEDED retention (at most
//     jobs.MaxReuseTTL) and a week more for the longest attempt
//     (jobs.ReuseInvalidationRetention).
//   - The idempotency window (24h) is a floor under every state's
//     retention: a job, and so its key, is kept at least that long after it
//     finished (and so after it was accepted). Inside it, a retry with the
//     same key returns the same job (EnqueueResult.Existing). Once the job
//     is pruned, its key is free: the same key accepts a new job, with a
//     new id and a new requested event. Clients must not retry a request
//     for longer than the window. An Enqueue racing the pruning of the job
//     holding its key (the key taken when its insert ran, the job gone a
//     statement later) fails with jobs.ErrKeyReleased having written
//     nothing; retry it, and it creates the new job.
//   - Published outbox events after 24h, with the relay's own statement:
//     a relay's pruning and this service's never fight (both delete small
//     batches with SKIP LOCKED). Unpublished events are kept (Never) unless
//     the host runs no relay and sets UnrelayedEvents; even then none is
//     deleted on a schema where a relay has ever held the leader lease (a
//     relay that stopped or is restarting must find its events).
//   - Inbox ids after 7 days (at least inbox.MinRetention): longer than any
//     broker's redelivery horizon, or a redelivered message would be
//     processed twice.
//   - Quarantined inbox messages (inbox_quarantine: poison, undecodable or
//     id-less messages set aside for people) after 30 days from their
//     receipt (InboxQuarantine): long enough to be looked at and replayed
//     by hand. They were never processed, so forgetting one cannot make a
//     message run twice.
//   - Webhook deliveries and their attempts after 30 days, and never less
//     than webhook.RetentionFloor of the default schedule (its whole span
//     plus a day, about two days). A delivery whose job is unfinished, or
//     is a dead letter this policy still keeps (a replay must find its
//     delivery), is kept however old: it goes once its jobs have succeeded
//     or been pruned.
//   - Expired admission permits at every pass, their slots handed back,
//     one pool per batch (its expired permits, up to BatchSize): a batch
//     locks one pool row, so only that pool's grant cycles wait for it.
//   - The usage ledger (admission_usage) is never pruned: tenants are
//     billed from it.
//
// # Guarantees
//
//   - One process prunes at a time. The service holds a row lease
//     (retention_lease, one row) with a holder and an expiry; the others
//     stand by and check every Interval. Every batch is a transaction that
//     first renews the lease under its row lock, so a takeover cannot
//     happen while a batch runs, and a holder that lost the lease (paused
//     past it) deletes nothing more. Run releases the lease when its
//     context ends; a holder that died is replaced after Lease (3×Interval)
//     at most, plus a standby's Interval.
//   - Nothing that is not due is deleted, whatever fails: a batch deletes a
//     job with its attempts and keys in one statement, in one transaction
//     with the lease's renewal, so a crash in the middle of a batch rolls
//     the whole batch back; the next pass starts again from what is due.
//   - Batches are small (BatchSize, 1,000 rows) and short: a batch's
//     locks are on rows nobody else writes (finished jobs, published
//     events, old ids and deliveries), taken with SKIP LOCKED, and no claim
//     reads the index the batches scan, so claims do not wait on the
//     pruner. Two exceptions hold a lock until their batch commits:
//     deleting a job that was replayed writes the replay's row (below),
//     and reaping expired permits locks each reaped pool's row, so that
//     pool's grant cycles wait for the batch.
//   - Connections: Run and PruneOnce use one pooled connection at a time.
//   - Configuration is validated by New: a bad field is a *ConfigError
//     naming it (matching ErrInvalidConfig), before anything is written.
//     BatchPause must be under half of Lease: only batches renew the
//     lease, so a longer pause would let it lapse in the middle of a pass.
//   - Warnings and errors go to Config.Logger (default slog.Default()); a
//     failed pass is tried again at the next Interval.
//
// # Operators
//
// Due counts what a pass would delete now (llmq prune --dry-run); it reads
// the due range of each index, so it costs in proportion to what is due.
// Status reads the lease (judged by the database's clock, not the
// reader's), the policy the holder prunes by, the last pass, the oldest
// row of each table (the first entry of an index) and the number of
// finished jobs per state: counted exactly up to jobs.ExactSizeLimit
// (10,000, a bounded index range), estimated beyond from the planner's
// statistics (as fresh as the last ANALYZE; llmq stats marks them "~").
// Every read is bounded, so Status is fast at any history size (llmq
// stats: about 70-90 ms for the whole command at 10M finished jobs, on a
// loaded machine). Status also reports the relay lease: a schema on which
// no relay ever ran has unpublished events that are not lag.
//
// llmq prune runs a one-off pass (Config.OneOff) with the recorded policy
// and any flags given: it takes the lease like any service, so it never
// prunes beside the running one (it refuses while that holds the lease),
// but it records neither its policy nor its pass, so the lease row keeps
// describing the running service.
//
// # Decisions
//
//   - Row deletes in small batches, not time-partitioned tables. Measured
//     with BenchmarkPruneWAL (5,000 jobs, PostgreSQL 15, full_page_writes
//     on): pruning a finished job with its attempt, its key and its two
//     published events writes about 520 B of WAL when its pages were
//     already written since the last checkpoint, and about 1,680 B right
//     after a checkpoint (full-page images: in steady state the pages
//     pruned were last written long before, so expect the higher figure;
//     wal_compression = lz4 reduces it). Dropping a partition costs almost
//     nothing, but llmq's tables cannot be partitioned by time without
//     losing guarantees: a partition holds jobs of every state, so one dead
//     letter kept 30 days pins its whole partition; a job's state changes,
//     so partitioning by finish time moves every row once more; and a
//     unique index on a partitioned table must include the partition key,
//     so (tenant, idempotency key) would be unique per partition only.
//     Storage v2 (issue 18) may revisit this with immutable event rows.
//   - jobs_finished_idx (state, finished_at), partial on finished jobs
//     (migration 0012), serves the deletes: each state's oldest first, so
//     one state's long retention costs another's pruning nothing. It adds
//     about 85 B of WAL per job to a drain (one entry, written at the
//     finishing update, which writes every index anyway) and nothing to a
//     claim. The same migration indexes jobs.replay_of: deleting a job
//     clears the link from its replays, which without an index is a
//     sequential scan of jobs per deleted job.
//   - A replay outlives the job it replayed: pruning the original clears
//     the replay's ReplayOf (the foreign key's ON DELETE SET NULL), which
//     writes the replay's row and holds its lock until the batch commits;
//     if the replay is waiting or running, its claim skips it and its
//     runner's next write waits for that batch.
//   - The lease is a row, not an advisory lock: an advisory lock lives
//     with a session, which a pool may hand to other work, and a row is
//     visible to operators.
package retention
