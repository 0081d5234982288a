-- Retention of finished jobs (see prune.go). Every statement reads one
-- state's entries of jobs_finished_idx (state, finished_at), partial on
-- finished jobs: waiting and running jobs have no entry there, so they can
-- be neither read nor deleted, and one state's long retention (dead
-- letters) costs another state's pruning nothing.

-- name: PruneFinished
-- Deletes up to $3 jobs of state $1 finished more than $2 ms ago (the
-- database's clock), oldest first, with their attempt rows and their
-- job_keys rows (idempotency keys, the tenant listing, a replay's replay
-- key), in one statement: a job never outlives or is outlived by its keys,
-- whatever fails. FOR UPDATE SKIP LOCKED: a finished job is only locked by
-- an operator's rare write (a replay reads it without a lock), and a pruner
-- never waits for it. The deletes probe job_attempts' primary key
-- (job_id, attempt), job_steps' (job_id, name) and job_keys' (tenant, id)
-- per job; deleting a job
-- clears replay_of on its replays through jobs_replay_of_idx.
WITH due AS (
    SELECT id, tenant
    FROM /*schema*/jobs
    WHERE state = $1 AND finished_at IS NOT NULL
        AND finished_at < now() - $2 * interval '1 millisecond'
    ORDER BY state, finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
-- The batch as arrays: joined to job_attempts and job_keys as unnest()
-- (estimated at a few rows, whatever the batch size), it is probed into
-- their primary keys job by job. Joined as the CTE it was hashed against
-- a sequential scan of each table whenever they were small enough.
batch AS (
    SELECT array_agg(id) AS ids, array_agg(tenant) AS tenants FROM due
),
attempts AS (
    DELETE FROM /*schema*/job_attempts AS a
    USING unnest((SELECT ids FROM batch)) AS d(id)
    WHERE a.job_id = d.id
    RETURNING 1
),
steps AS (
    DELETE FROM /*schema*/job_steps AS s
    USING unnest((SELECT ids FROM batch)) AS d(id)
    WHERE s.job_id = d.id
    RETURNING 1
),
keys AS (
    DELETE FROM /*schema*/job_keys AS k
    USING unnest((SELECT tenants FROM batch), (SELECT ids FROM batch)) AS d(tenant, id)
    WHERE k.tenant = d.tenant AND k.id = d.id
    RETURNING 1
),
gone AS (
    DELETE FROM /*schema*/jobs AS j
    USING unnest((SELECT ids FROM batch)) AS d(id)
    WHERE j.id = d.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM attempts), (SELECT count(*) FROM keys),
    (SELECT count(*) FROM steps);

-- name: PruneBatches
-- Deletes up to $2 batches finished more than $1 ms ago, oldest first,
-- through job_batches_finished_idx (partial on finished batches: an open
-- batch has no entry, so it can be neither read nor deleted here). A
-- finished batch's row is written by nobody (its jobs are all terminal),
-- so SKIP LOCKED only guards against a second pruner. The retention
-- service passes the longest retention of the finished states, so a batch
-- outlives every job it counted. The due ids go to the delete as an array,
-- probed into the primary key one by one: joined as a CTE they were hashed
-- against a sequential scan of job_batches.
DELETE FROM /*schema*/job_batches
WHERE id = ANY (ARRAY(
    SELECT id
    FROM /*schema*/job_batches
    WHERE finished_at IS NOT NULL
        AND finished_at < now() - $1 * interval '1 millisecond'
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
));

-- name: PruneReuseInvalidations
-- Deletes up to $2 reuse invalidations recorded more than $1 ms ago,
-- oldest first, by primary key. The table holds a row per operator
-- action, so reading it whole costs nothing. Nothing writes an
-- invalidation after it is recorded, so SKIP LOCKED only guards against a
-- second pruner.
DELETE FROM /*schema*/job_reuse_invalidations
WHERE id = ANY (ARRAY(
    SELECT id
    FROM /*schema*/job_reuse_invalidations
    WHERE invalidated_at < now() - $1 * interval '1 millisecond'
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
));

-- name: CountReuseInvalidations
-- How many reuse invalidations were recorded more than $1 ms ago: what
-- PruneReuseInvalidations would delete.
SELECT count(*)
FROM /*schema*/job_reuse_invalidations
WHERE invalidated_at < now() - $1 * interval '1 millisecond';

-- name: CountBatches
-- How many batches finished more than $1 ms ago: what PruneBatches would
-- delete. A count over the due range of job_batches_finished_idx.
SELECT count(*)
FROM /*schema*/job_batches
WHERE finished_at IS NOT NULL
    AND finished_at < now() - $1 * interval '1 millisecond';

-- name: CountFinished
-- How many jobs of state $1 finished more than $2 ms ago: what
-- PruneFinished would delete. An index-only count over the due range of
-- jobs_finished_idx.
SELECT count(*)
FROM /*schema*/jobs
WHERE state = $1 AND finished_at IS NOT NULL
    AND finished_at < now() - $2 * interval '1 millisecond';

-- name: OldestFinished
-- The finish time of state $1's oldest job (NULL when none): the first
-- entry of that state in jobs_finished_idx.
SELECT min(finished_at)
FROM /*schema*/jobs
WHERE state = $1 AND finished_at IS NOT NULL;

-- name: CountFinishedUpTo
-- How many jobs of state $1 there are, counting no further than $2: an
-- index-only scan of that state's entries in jobs_finished_idx, stopped
-- by the LIMIT, so its cost is bounded whatever the history.
SELECT count(*)
FROM (
    SELECT FROM /*schema*/jobs
    WHERE state = $1 AND finished_at IS NOT NULL
    LIMIT $2
) AS f;

-- name: EstimateFinished
-- The planner's estimate of the jobs of each finished state, in this
-- order: SUCCEEDED, REVIEW_REQUIRED, FAILED_TERMINAL, CANCELLED, one branch
-- of the plan's Append each. The estimate is the table's row count as of
-- its last VACUUM or ANALYZE, scaled to its size now, times the state's
-- frequency in the column statistics ANALYZE keeps; EXPLAIN reads them
-- without running anything, and needs no privilege beyond reading jobs
-- (pg_stats' view costs tens of milliseconds a read).
EXPLAIN (FORMAT JSON)
SELECT FROM /*schema*/jobs WHERE state = 'SUCCEEDED' AND finished_at IS NOT NULL
UNION ALL
SELECT FROM /*schema*/jobs WHERE state = 'REVIEW_REQUIRED' AND finished_at IS NOT NULL
UNION ALL
SELECT FROM /*schema*/jobs WHERE state = 'FAILED_TERMINAL' AND finished_at IS NOT NULL
UNION ALL
SELECT FROM /*schema*/jobs WHERE state = 'CANCELLED' AND finished_at IS NOT NULL;
