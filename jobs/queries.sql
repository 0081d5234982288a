-- Queries of the job store. Tables are written /*schema*/name; the store
-- renders them for its schema once, at construction.

-- name: InsertJobs
-- Inserts a batch of jobs and, in the same statement, one "<kind>.requested"
-- outbox event per job actually inserted. One statement is atomic even on a
-- pool, and costs one round trip. A key already taken by the same tenant
-- inserts nothing (ON CONFLICT DO NOTHING waits for a concurrent inserter of
-- that key to finish, so a racing duplicate never slips in); the caller then
-- reads the existing job with SelectJobsByIdempotencyKey.
WITH input AS (
    SELECT *
    FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::smallint[],
        $6::text[], $7::text[], $8::text[], $9::text[], $10::integer[],
        $11::timestamptz[], $12::timestamptz[], $13::bigint[], $14::uuid[]
    ) AS input (
        id, tenant, kind, queue, priority,
        idempotency_key, request_hash, payload, group_key, max_attempts,
        available_at, deadline_at, estimated_tokens, event_id
    )
),
job AS (
    INSERT INTO /*schema*/jobs (
        id, tenant, kind, queue, priority,
        idempotency_key, request_hash, payload, group_key, max_attempts,
        available_at, deadline_at, estimated_tokens
    )
    SELECT
        id, tenant, kind, queue, priority,
        idempotency_key, request_hash, payload::jsonb, group_key, max_attempts,
        coalesce(available_at, now()), deadline_at, estimated_tokens
    FROM input
    ON CONFLICT (tenant, idempotency_key) DO NOTHING
    RETURNING
        id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
        group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
        available_at, deadline_at, state_version, estimated_tokens, result,
        error_class, last_error, replay_of, cancel_requested_at, created_at,
        updated_at, finished_at
),
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT input.event_id, job.id, $15, job.id::text, job.kind || '.requested',
        jsonb_build_object(
            'job_id', job.id, 'tenant', job.tenant, 'kind', job.kind, 'queue', job.queue,
            'state', job.state, 'state_version', job.state_version, 'attempt', job.attempt)
    FROM job JOIN input ON input.id = job.id
)
SELECT
    id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
    group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
    available_at, deadline_at, state_version, estimated_tokens, result,
    error_class, last_error, replay_of, cancel_requested_at, created_at,
    updated_at, finished_at
FROM job
-- Wake runners on commit for the queues in $17 (the store's notify limiter
-- chose them). pg_notify returns void, which IS NOT NULL; calling it in
-- WHERE runs it once per inserted job of those queues, and Postgres folds
-- identical notifications within a transaction into one.
WHERE NOT (job.queue = ANY ($17::text[])) OR pg_notify($16, job.queue) IS NOT NULL;

-- name: SelectJobsByIdempotencyKey
-- The jobs holding the given (tenant, key) pairs; served by the unique
-- constraint's index.
SELECT
    id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
    group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
    available_at, deadline_at, state_version, estimated_tokens, result,
    error_class, last_error, replay_of, cancel_requested_at, created_at,
    updated_at, finished_at
FROM /*schema*/jobs
WHERE (tenant, idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]));

-- name: GetJob
-- Every read is tenant-scoped: another tenant's id finds nothing.
SELECT
    id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
    group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
    available_at, deadline_at, state_version, estimated_tokens, result,
    error_class, last_error, replay_of, cancel_requested_at, created_at,
    updated_at, finished_at
FROM /*schema*/jobs
WHERE tenant = $1 AND id = $2;

-- name: ListJobs
-- Newest first with keyset pagination on the time-ordered id, served by
-- jobs_tenant_id_idx; state and kind filters are applied while walking it.
SELECT
    id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
    group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
    available_at, deadline_at, state_version, estimated_tokens, result,
    error_class, last_error, replay_of, cancel_requested_at, created_at,
    updated_at, finished_at
FROM /*schema*/jobs
WHERE tenant = $1
    AND (cardinality($2::text[]) = 0 OR state = ANY ($2::text[]))
    AND ($3::text = '' OR kind = $3::text)
    AND ($4::uuid IS NULL OR id < $4::uuid)
ORDER BY tenant, id DESC
LIMIT $5;

-- name: CancelJob
-- Waiting jobs become CANCELLED with a "<kind>.cancelled" event; a RUNNING
-- job only records the request, which its runner honours. The UPDATE's WHERE
-- is re-checked on the newest row version under READ COMMITTED, so a job
-- claimed concurrently is treated as RUNNING, never cancelled under its
-- worker. When nothing changes, the second branch returns the row as it was.
WITH changed AS (
    UPDATE /*schema*/jobs
    SET state               = CASE WHEN state = 'RUNNING' THEN state ELSE 'CANCELLED' END,
        cancel_requested_at = now(),
        finished_at         = CASE WHEN state = 'RUNNING' THEN NULL ELSE now() END,
        state_version       = state_version + 1,
        updated_at          = now()
    WHERE tenant = $1 AND id = $2
        AND (state IN ('READY', 'RETRY_SCHEDULED')
            OR (state = 'RUNNING' AND cancel_requested_at IS NULL))
    RETURNING
        id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
        group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
        available_at, deadline_at, state_version, estimated_tokens, result,
        error_class, last_error, replay_of, cancel_requested_at, created_at,
        updated_at, finished_at
),
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT $3, id, $4, id::text, kind || '.cancelled',
        jsonb_build_object(
            'job_id', id, 'tenant', tenant, 'kind', kind, 'queue', queue,
            'state', state, 'state_version', state_version, 'attempt', attempt)
    FROM changed
    WHERE state = 'CANCELLED'
)
SELECT
    id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
    group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
    available_at, deadline_at, state_version, estimated_tokens, result,
    error_class, last_error, replay_of, cancel_requested_at, created_at,
    updated_at, finished_at
FROM changed
UNION ALL
SELECT
    id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
    group_key, state, attempt, max_attempts, fence, lease_owner, lease_until,
    available_at, deadline_at, state_version, estimated_tokens, result,
    error_class, last_error, replay_of, cancel_requested_at, created_at,
    updated_at, finished_at
FROM /*schema*/jobs
WHERE tenant = $1 AND id = $2 AND NOT EXISTS (SELECT FROM changed);

-- name: QueueStats
-- Counts by queue and state, and the age of the oldest job that is eligible
-- now. This reads every job row: an operator's query, not a hot path.
SELECT
    queue,
    state,
    count(*),
    coalesce(extract(epoch FROM now() - min(available_at)
        FILTER (WHERE state IN ('READY', 'RETRY_SCHEDULED') AND available_at <= now())), 0)::float8
FROM /*schema*/jobs
GROUP BY queue, state
ORDER BY queue, state;
