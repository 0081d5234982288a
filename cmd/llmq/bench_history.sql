-- History for `llmq bench -mode drain -history N`: finished jobs, as a
-- long-lived host with no pruning would hold, written set-based (a chunk
-- per statement) instead of through the runner, so ten million rows take
-- minutes, not hours. Each job has what a real finished job has: its
-- job_keys row (the tenant listing), one attempt row, and its finish in
-- jobs_finished_idx. Outbox events are not written: published events are
-- the relay's own retention.

-- name: FillHistory
-- $1 jobs finished over the hour before $2 ms ago, $3 tenants round robin,
-- 95 % SUCCEEDED, the rest spread over the other finished states. Ids are
-- UUIDv7-shaped (time-ordered, like the store's) so the primary key stays
-- append-mostly as in production.
WITH input AS (
    SELECT
        (lpad(to_hex((extract(epoch FROM t.finished) * 1000)::bigint), 12, '0')
            || '7' || substr(md5(g::text || clock_timestamp()::text), 1, 19))::uuid AS id,
        'tenant-' || (g % $3) AS tenant,
        CASE WHEN g % 20 <> 0 THEN 'SUCCEEDED'
            WHEN g % 60 = 0 THEN 'FAILED_TERMINAL'
            WHEN g % 60 = 20 THEN 'REVIEW_REQUIRED'
            ELSE 'CANCELLED' END AS state,
        t.finished
    FROM generate_series(1, $1::bigint) AS g,
        LATERAL (SELECT now() - $2 * interval '1 millisecond' - interval '1 hour' * (1 - g::float8 / $1) AS finished) AS t
),
keys AS (
    INSERT INTO /*schema*/job_keys (tenant, id)
    SELECT tenant, id FROM input
),
attempts AS (
    INSERT INTO /*schema*/job_attempts (job_id, attempt, fence, worker, started_at, ended_at, outcome)
    SELECT id, 1, 1, 'history', finished - interval '1 second', finished,
        CASE state WHEN 'SUCCEEDED' THEN 'succeeded' WHEN 'CANCELLED' THEN 'cancelled'
            WHEN 'REVIEW_REQUIRED' THEN 'review_required' ELSE 'failed' END
    FROM input
)
INSERT INTO /*schema*/jobs (id, tenant, kind, queue, payload, state, attempt, max_attempts, fence,
    attempted_at, available_at, created_at, updated_at, finished_at, result)
SELECT id, tenant, 'bench.history', 'default', '{"n":1}', state, 1, 3, 1,
    finished - interval '1 second', finished - interval '2 seconds', finished - interval '2 seconds', finished, finished,
    CASE WHEN state = 'SUCCEEDED' THEN '{"ok":true}'::jsonb END
FROM input;
