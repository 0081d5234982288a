-- Fewer index entries per job, and room for heap-only updates.
--
-- Every index on jobs gets an entry for each new row version whose values
-- satisfy its predicate, and a state change (claim, completion) is never a
-- heap-only update: state is in the predicates. So what a job's life costs
-- follows how many indexes hold a waiting or running job. Before it, an
-- accepted job got entries in jobs_pkey, jobs_tenant_claim_idx and
-- jobs_pending_tenant_idx, and its claim in jobs_pkey,
-- jobs_pending_tenant_idx, jobs_running_tenant_idx and
-- jobs_lease_expiry_idx.
--
-- Measured with llmq bench -mode drain -jobs 20000 -workers 100 (WAL
-- records of the bench schema, bytes per job, PostgreSQL 15): insert 1,291
-- -> 1,217; claim and completion 2,030 -> 1,790 (the fill factor alone
-- about -120: an update that fits on its page also saves the row lock
-- PostgreSQL logs before moving a row to another page; the indexes alone
-- about -100); the whole run 3,320 -> 3,010. A heartbeat (2,000 running
-- jobs, each lease extended twice): 587 bytes and 6 WAL records per job
-- per heartbeat -> 85 bytes and 1 record, every one heap-only.
--
-- After it: the waiting and the running jobs each have one index besides the
-- primary key, both leading with the tenant so that they also serve the
-- acceptance quota's count of a tenant's unfinished jobs (which
-- jobs_pending_tenant_idx served):
--   - jobs_tenant_claim_idx (tenant, queue, priority, available_at, id) on
--     waiting jobs: the claim, the idle-tenant sweep and the unserved-kind
--     warning look a (queue, tenant) up by equality on both, so the order of
--     the two does not change their plans;
--   - jobs_running_tenant_idx (tenant, queue) on RUNNING jobs: the cap
--     check (by tenant and queue), a runner's own leases and the reaper,
--     which now reads every running job's row to find the expired leases
--     (a cost that follows the number of jobs running, not the table).
-- jobs_lease_expiry_idx and jobs_pending_tenant_idx are dropped. No index
-- holds lease_until any more, so a heartbeat (which only moves lease_until)
-- can be a heap-only update: no index entry at all.
--
-- Half-filled pages: a claim, a completion and a heartbeat update the row
-- on its own page when there is room, which costs less WAL than moving it
-- to another page, and is what lets a heartbeat be heap-only. Only pages
-- written from now on are affected. The price is space: the fill factor
-- applies to inserts too, so the pages of jobs that finish and are never
-- updated again stay about half full, and history takes about twice the
-- heap it took before (measured: 279 MB against 130 MB for 800,000 jobs).
-- Retention (package retention) keeps history bounded; a reader that
-- scans finished jobs (llmq jobs list with no filter) reads about twice
-- the pages.
--
-- Locks: the new indexes are built first, under temporary names, each
-- under a SHARE lock (writes to jobs wait, reads go on); only then are the
-- old ones dropped (DROP INDEX takes an ACCESS EXCLUSIVE lock on jobs,
-- held until the migration commits, a moment later) and the new ones
-- renamed. A migration runs in a transaction, so not CONCURRENTLY: on a
-- large backlog, migrate at a quiet time. Finished jobs are in none of
-- these indexes, so each build reads the table once and writes only the
-- unfinished jobs' entries.
ALTER TABLE /*schema*/jobs SET (fillfactor = 50);

CREATE INDEX jobs_tenant_claim_idx_0013 ON /*schema*/jobs (tenant, queue, priority, available_at, id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');
CREATE INDEX jobs_running_tenant_idx_0013 ON /*schema*/jobs (tenant, queue)
    WHERE state = 'RUNNING';

DROP INDEX /*schema*/jobs_lease_expiry_idx;
DROP INDEX /*schema*/jobs_pending_tenant_idx;
DROP INDEX /*schema*/jobs_tenant_claim_idx;
DROP INDEX /*schema*/jobs_running_tenant_idx;

ALTER INDEX /*schema*/jobs_tenant_claim_idx_0013 RENAME TO jobs_tenant_claim_idx;
ALTER INDEX /*schema*/jobs_running_tenant_idx_0013 RENAME TO jobs_running_tenant_idx;
