-- Batches of jobs (see batches.go). A batch's row holds its progress,
-- which every statement that finishes jobs keeps (the batch_progress
-- block, below).

-- The batch_progress block. Every statement that moves jobs to a
-- terminal state (CompleteJobs, ReapExpiredLeases, FailExpiredDeadlines,
-- CancelJob and CancelBatch) ends with it, after a batch_jobs CTE of the
-- jobs it changed, so a batch's counts change in the statement, and
-- commit, of its jobs' own transitions: batch_jobs takes the changed jobs that belong to a batch
-- and are now terminal (a job becomes terminal once, so each is counted
-- once); batch_counts adds them up per batch; batch_locked locks the
-- batches' rows in id order (two statements finishing jobs of the same
-- batches cannot deadlock on them, and a statement that waited reads the
-- row's newest version); batch_progress adds the counts; batch_event
-- writes "batch.completed" when this statement's update brought finished
-- to total. Finished only grows, and the row lock orders the statements
-- that finish a batch's last jobs, so exactly one of them sees that
-- happen, however many runners finish them at once.

-- block: batch_progress
-- Follows each statement's batch_jobs (its changed jobs: batch_id, state).
batch_counts AS (
    SELECT batch_id, count(*) AS finished,
        count(*) FILTER (WHERE state = 'SUCCEEDED') AS succeeded,
        count(*) FILTER (WHERE state = 'REVIEW_REQUIRED') AS review_required,
        count(*) FILTER (WHERE state = 'FAILED_TERMINAL') AS failed,
        count(*) FILTER (WHERE state = 'CANCELLED') AS cancelled
    FROM batch_jobs
    GROUP BY batch_id
),
batch_locked AS (
    SELECT b.id FROM /*schema*/job_batches AS b
    WHERE b.id IN (SELECT batch_id FROM batch_counts)
    ORDER BY b.id
    FOR UPDATE
),
batch_progress AS (
    UPDATE /*schema*/job_batches AS b
    SET finished        = b.finished + c.finished,
        succeeded       = b.succeeded + c.succeeded,
        review_required = b.review_required + c.review_required,
        failed          = b.failed + c.failed,
        cancelled       = b.cancelled + c.cancelled,
        finished_at     = CASE WHEN b.finished + c.finished = b.total THEN now() END
    FROM batch_locked AS l
    JOIN batch_counts AS c ON c.batch_id = l.id
    WHERE b.id = l.id
    RETURNING b.*
),
batch_event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT gen_random_uuid(), p.id, p.topic, p.id::text, 'batch.completed',
        jsonb_build_object('batch_id', p.id, 'tenant', p.tenant, 'batch_key', p.batch_key, 'total', p.total,
            'succeeded', p.succeeded, 'review_required', p.review_required, 'failed', p.failed,
            'cancelled', p.cancelled)
    FROM batch_progress AS p
    WHERE p.finished = p.total
),

-- fragment: batch_columns
-- Every batch query returns these columns in this order; batchRow reads them.
id, tenant, batch_key, request_hash, total, finished, succeeded, review_required,
failed, cancelled, created_at, finished_at

-- name: InsertBatch
-- A new batch, unless the tenant already has one under the key: ON
-- CONFLICT DO NOTHING waits for a concurrent inserter of the key to
-- commit, so two racing acceptances of one batch give one batch; the
-- caller reads the existing one with GetBatchByKey.
INSERT INTO /*schema*/job_batches (id, tenant, batch_key, request_hash, topic, total)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant, batch_key) DO NOTHING
RETURNING /*batch_columns*/;

-- name: GetBatch
-- One primary-key probe, whatever the batch's size: its progress is kept
-- on its row.
SELECT /*batch_columns*/
FROM /*schema*/job_batches
WHERE tenant = $1 AND id = $2;

-- name: GetBatchByKey
-- Through the (tenant, batch_key) unique index.
SELECT /*batch_columns*/
FROM /*schema*/job_batches
WHERE tenant = $1 AND batch_key = $2;

-- name: ListBatchJobs
-- The tenant's batch $2's jobs, through jobs_batch_idx, in id order, which
-- is input order: EnqueueBatch gives a batch's jobs UUIDv7 ids in input
-- order, and they increase strictly within a process. For a repeated
-- acceptance of the batch, so a caller that lost the first answer learns
-- its jobs. Takes no lock.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE tenant = $1 AND batch_id = $2
ORDER BY id;

-- name: CancelBatch
-- Cancels the tenant's batch $2: its waiting jobs become CANCELLED, each
-- with its "<kind>.cancelled" event (topic $3), and its running jobs
-- record the request, which their runners honour, as CancelJob does for
-- one job. The jobs are found through jobs_batch_idx and locked in id
-- order, the order in which completions lock them (jobs.lockOrder), so a
-- cancel and a completion batch cannot deadlock; a job a claim holds is
-- waited for and then seen RUNNING. The batch's progress is kept in the
-- same statement (the block below, as in CompleteJobs), and the
-- cancellation that finishes the batch writes its completion event.
WITH locked AS (
    SELECT id
    FROM /*schema*/jobs
    WHERE batch_id = $2 AND tenant = $1
        AND (state IN ('READY', 'RETRY_SCHEDULED')
            OR (state = 'RUNNING' AND cancel_requested_at IS NULL))
    ORDER BY id
    FOR UPDATE
),
changed AS (
    UPDATE /*schema*/jobs AS j
    SET state               = CASE WHEN j.state = 'RUNNING' THEN j.state ELSE 'CANCELLED' END,
        cancel_requested_at = now(),
        finished_at         = CASE WHEN j.state = 'RUNNING' THEN NULL ELSE now() END,
        state_version       = j.state_version + 1,
        updated_at          = now()
    FROM locked AS l
    WHERE j.id = l.id
    RETURNING j.id, j.tenant, j.kind, j.queue, j.state, j.state_version, j.attempt, j.events, j.batch_id
),
-- The batch progress of the jobs this statement finished: batch_jobs,
-- then the batch_progress block (batches.sql).
batch_jobs AS (
    SELECT batch_id, state FROM changed
    WHERE batch_id IS NOT NULL AND state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
),
/*batch_progress*/
-- The cancelled jobs' events, one batch row when there are several (see
-- write_events in queries.sql).
new_events AS MATERIALIZED (
    SELECT /*next_event_seq*/, gen_random_uuid() AS event_id, id AS aggregate_id, $3::text AS topic, id::text AS key,
        kind || '.cancelled' AS event_type,
        jsonb_build_object(
            'job_id', id, 'tenant', tenant, 'kind', kind, 'queue', queue,
            'state', state, 'state_version', state_version, 'attempt', attempt)
            || CASE WHEN batch_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('batch_id', batch_id) END AS payload,
        '{}'::jsonb AS headers
    FROM changed
    WHERE state = 'CANCELLED' AND events
),
/*write_events*/
SELECT count(*) FILTER (WHERE state = 'CANCELLED'), count(*) FILTER (WHERE state = 'RUNNING')
FROM changed;
