-- Queries of the job store. Tables are written /*schema*/name; the store
-- renders them for its schema once, at construction.

-- fragment: job_columns
-- Every job query returns these columns in this order; scanJob reads them.
id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
group_key, state, attempt, max_attempts, fence, lease_owner, lease_until, attempted_at,
available_at, deadline_at, state_version, estimated_tokens, result,
error_class, last_error, replay_of, replayed_by, replay_reason,
cancel_requested_at, created_at, updated_at, finished_at

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
        /*job_columns*/
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
    /*job_columns*/
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
    /*job_columns*/
FROM /*schema*/jobs
WHERE (tenant, idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]));

-- name: GetJob
-- Every read is tenant-scoped: another tenant's id finds nothing.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE tenant = $1 AND id = $2;

-- name: ListJobs
-- Newest first with keyset pagination on the time-ordered id, served by
-- jobs_tenant_id_idx; state and kind filters are applied while walking it.
SELECT
    /*job_columns*/
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
        /*job_columns*/
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
    /*job_columns*/
FROM changed
UNION ALL
SELECT
    /*job_columns*/
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

-- name: ClaimJobs
-- Claims up to $2 eligible jobs of queue $1 for worker $3, in one statement
-- (one short transaction). The scan follows jobs_claim_idx in (priority,
-- available_at, id) order; FOR UPDATE SKIP LOCKED lets concurrent runners
-- claim disjoint batches without waiting on each other. Jobs whose deadline
-- has passed are never claimed (the deadline sweep fails them), and only
-- kinds the worker can run ($5) are taken, so a runner of an older build
-- never claims work it has no handler for. Claiming bumps attempt and fence;
-- the attempt's row is written when the attempt ends.
WITH picked AS (
    SELECT id
    FROM /*schema*/jobs
    WHERE queue = $1
        AND state IN ('READY', 'RETRY_SCHEDULED')
        AND available_at <= now()
        AND (deadline_at IS NULL OR deadline_at > now())
        AND kind = ANY ($5::text[])
    ORDER BY priority, available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE /*schema*/jobs AS j
SET state         = 'RUNNING',
    attempt       = j.attempt + 1,
    fence         = j.fence + 1,
    lease_owner   = $3,
    lease_until   = now() + $4 * interval '1 millisecond',
    attempted_at  = now(),
    state_version = j.state_version + 1,
    updated_at    = now()
-- The picked ids as an array probe the primary key, whatever the table's
-- size; a join with the CTE can be planned as a scan of the whole table.
WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING /*job_columns*/;

-- name: HeartbeatLeases
-- Extends every lease worker $1 still holds, in one statement. A lease
-- matches only while the job is RUNNING under the same owner and fence (the
-- fence changes whenever a lease begins or ends, so a matching fence means
-- RUNNING under this lease) and has not expired: a lease that lapsed stays
-- lapsed even if the reaper has not run yet, so a paused worker cannot
-- resurrect it. As in CompleteJobs, the state is implied by the fence and
-- not written out, so the planner probes the primary key. Returned rows are
-- the leases kept, with whether cancellation was requested.
UPDATE /*schema*/jobs AS j
SET lease_until = now() + $2 * interval '1 millisecond'
FROM unnest($3::uuid[], $4::bigint[]) AS lease (id, fence)
WHERE j.id = ANY ($3::uuid[])
    AND j.id = lease.id
    AND j.fence = lease.fence
    AND j.lease_owner = $1
    AND j.lease_until > now()
RETURNING j.id, j.cancel_requested_at IS NOT NULL;

-- name: CompleteJobs
-- Records a batch of attempt outcomes, each conditional on its fence: a job
-- changes only while it is still in the lease its attempt was claimed with.
-- The fence changes whenever a lease begins (claim) or ends (completion,
-- release, reaper), so "fence matches" means "RUNNING under this attempt's
-- lease"; the UPDATE locks each matching row and, under READ COMMITTED,
-- re-checks the fence on the newest row version, so a completion racing the
-- reaper or another worker either wins cleanly or changes nothing. The
-- caller records the ones that changed nothing with MarkStaleAttempts.
--
-- The WHERE deliberately says "fence" and not also "state = 'RUNNING'": that
-- clause would let the planner drive the join from jobs_lease_expiry_idx
-- (every RUNNING job) instead of probing the primary key once per
-- completion, and generic plans did, at a cost growing with concurrency.
-- "id = ANY" gives it the primary-key probe.
--
-- A snooze becomes RETRY_SCHEDULED at now() + delay and raises max_attempts
-- by one, so the attempt it used does not count against the retry budget
-- (the attempt counter itself never goes back). A retry becomes
-- RETRY_SCHEDULED at now() + delay, unless the attempts are used up, or the next attempt plus its reserved margin would end after the
-- deadline (then FAILED_TERMINAL with class 'deadline'). In the same
-- statement: each attempt's row, and the outbox event of each terminal
-- transition.
WITH updated AS (
    UPDATE /*schema*/jobs AS j
    SET fence         = j.fence + 1, -- the lease ends
        state         = CASE
                            WHEN i.outcome = 'succeeded' THEN 'SUCCEEDED'
                            WHEN i.outcome = 'review_required' THEN 'REVIEW_REQUIRED'
                            WHEN i.outcome = 'cancelled' THEN 'CANCELLED'
                            WHEN i.outcome IN ('released', 'snoozed') THEN 'RETRY_SCHEDULED'
                            WHEN i.outcome = 'retry' AND j.attempt < j.max_attempts
                                AND (j.deadline_at IS NULL OR now() + (i.delay_ms + i.margin_ms) * interval '1 millisecond' <= j.deadline_at)
                                THEN 'RETRY_SCHEDULED'
                            ELSE 'FAILED_TERMINAL'
                        END,
        available_at  = now() + i.delay_ms * interval '1 millisecond',
        max_attempts  = j.max_attempts + CASE WHEN i.outcome = 'snoozed' THEN 1 ELSE 0 END,
        result        = coalesce(i.result::jsonb, j.result),
        error_class   = CASE
                            WHEN i.outcome = 'snoozed' THEN j.error_class
                            WHEN i.outcome = 'retry' AND j.attempt < j.max_attempts
                                AND j.deadline_at IS NOT NULL
                                AND now() + (i.delay_ms + i.margin_ms) * interval '1 millisecond' > j.deadline_at
                                THEN 'deadline'
                            ELSE i.error_class
                        END,
        last_error    = CASE
                            WHEN i.outcome = 'snoozed' THEN j.last_error
                            WHEN i.outcome <> 'retry' THEN coalesce(i.error, j.last_error)
                            WHEN j.attempt >= j.max_attempts
                                THEN i.error || ' (attempt ' || j.attempt || ' of ' || j.max_attempts || ': no attempts left)'
                            WHEN j.deadline_at IS NOT NULL
                                AND now() + (i.delay_ms + i.margin_ms) * interval '1 millisecond' > j.deadline_at
                                THEN i.error || ' (a retry in ' || i.delay_ms || ' ms would end after the deadline)'
                            ELSE i.error
                        END,
        finished_at   = CASE
                            WHEN i.outcome IN ('released', 'snoozed') THEN NULL
                            WHEN i.outcome = 'retry' AND j.attempt < j.max_attempts
                                AND (j.deadline_at IS NULL OR now() + (i.delay_ms + i.margin_ms) * interval '1 millisecond' <= j.deadline_at)
                                THEN NULL
                            ELSE now()
                        END,
        state_version = j.state_version + 1,
        updated_at    = now()
    FROM unnest(
        $1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::text[],
        $6::text[], $7::bigint[], $8::bigint[], $9::boolean[], $10::bigint[],
        $11::bigint[], $12::uuid[]
    ) AS i (
        id, fence, outcome, result, error_class,
        error, delay_ms, margin_ms, uncertain, input_tokens,
        output_tokens, event_id
    )
    WHERE j.id = ANY ($1::uuid[])
        AND j.id = i.id
        AND j.fence = i.fence
    RETURNING
        /*job_columns j*/,
        i.outcome AS reported, i.error AS reported_error, i.uncertain, i.input_tokens, i.output_tokens, i.event_id
),
attempt AS (
    INSERT INTO /*schema*/job_attempts (
        job_id, attempt, fence, worker, started_at, outcome, error_class, error,
        retry_at, input_tokens, output_tokens, uncertain
    )
    SELECT id, attempt, fence, lease_owner, attempted_at,
        CASE state
            WHEN 'SUCCEEDED' THEN 'succeeded'
            WHEN 'REVIEW_REQUIRED' THEN 'review_required'
            WHEN 'CANCELLED' THEN 'cancelled'
            WHEN 'FAILED_TERMINAL' THEN 'failed'
            ELSE CASE WHEN reported IN ('released', 'snoozed') THEN reported ELSE 'retry_scheduled' END
        END,
        CASE WHEN reported = 'snoozed' THEN NULL ELSE error_class END,
        CASE reported WHEN 'succeeded' THEN NULL WHEN 'snoozed' THEN reported_error ELSE last_error END,
        CASE WHEN state = 'RETRY_SCHEDULED' THEN available_at END,
        input_tokens, output_tokens, uncertain
    FROM updated
),
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT event_id, id, $13, id::text,
        kind || CASE state
            WHEN 'SUCCEEDED' THEN '.completed'
            WHEN 'REVIEW_REQUIRED' THEN '.review_required'
            WHEN 'CANCELLED' THEN '.cancelled'
            ELSE '.dead_lettered'
        END,
        jsonb_build_object(
            'job_id', id, 'tenant', tenant, 'kind', kind, 'queue', queue,
            'state', state, 'state_version', state_version, 'attempt', attempt,
            'error_class', error_class)
    FROM updated
    WHERE state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
)
SELECT
    /*job_columns*/
FROM updated;

-- name: MarkStaleAttempts
-- Completions that arrived after their lease was lost: only the attempt's
-- own row records them. The reaper wrote that row when it took the lease
-- back (the only way a fence moves on under a live attempt); the insert
-- covers a row that is missing anyway (its started_at is then unknown and
-- recorded as now()).
INSERT INTO /*schema*/job_attempts AS a (
    job_id, attempt, fence, worker, started_at, outcome, error, input_tokens, output_tokens, uncertain
)
SELECT s.id, s.attempt, s.fence, s.worker, now(), 'stale',
    'completion (' || s.outcome || ') arrived after the lease was lost',
    s.input_tokens, s.output_tokens, s.uncertain
FROM unnest($1::uuid[], $2::integer[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::boolean[])
    AS s (id, attempt, fence, worker, outcome, input_tokens, output_tokens, uncertain)
ON CONFLICT (job_id, attempt) DO UPDATE
SET outcome       = 'stale',
    error         = excluded.error || ' (the attempt had ended: ' || a.outcome || coalesce(': ' || a.error, '') || ')',
    input_tokens  = excluded.input_tokens,
    output_tokens = excluded.output_tokens,
    uncertain     = a.uncertain OR excluded.uncertain
-- Only the reaper's record is amended: an outcome already recorded by this
-- attempt itself (a completion retried after an ambiguous commit) stands.
WHERE a.fence = excluded.fence AND a.outcome = 'lease_expired';

-- name: ReapExpiredLeases
-- Takes back up to $1 jobs whose lease expired (their worker stopped
-- heartbeating), oldest expiry first via jobs_lease_expiry_idx, skipping rows
-- another reaper or a late completion holds. Each becomes RETRY_SCHEDULED
-- with a bumped fence, so the lost worker can no longer complete it, and a
-- full-jitter backoff (per-kind policies in $4..$6, default $2/$3 ms) — or
-- FAILED_TERMINAL when its attempts are used up or the next attempt plus the
-- margin $7 would end after its deadline. The attempt is marked uncertain:
-- its provider call may have been made and billed.
WITH expired AS (
    SELECT id, lease_owner
    FROM /*schema*/jobs
    WHERE state = 'RUNNING' AND lease_until < now()
    ORDER BY lease_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
decided AS (
    SELECT
        j.id,
        e.lease_owner,
        (random() * least(
            coalesce(p.cap_ms, $3),
            coalesce(p.base_ms, $2) * power(2, least(j.attempt - 1, 60))
        ))::bigint AS delay_ms,
        CASE
            WHEN j.attempt >= j.max_attempts THEN 'lease_expired'
            WHEN j.deadline_at IS NOT NULL AND now() + $7 * interval '1 millisecond' > j.deadline_at THEN 'deadline'
        END AS terminal_class
    FROM expired AS e
    JOIN /*schema*/jobs AS j ON j.id = e.id
    LEFT JOIN unnest($4::text[], $5::bigint[], $6::bigint[]) AS p (kind, base_ms, cap_ms) ON p.kind = j.kind
),
reaped AS (
    UPDATE /*schema*/jobs AS j
    SET state         = CASE WHEN d.terminal_class IS NULL THEN 'RETRY_SCHEDULED' ELSE 'FAILED_TERMINAL' END,
        fence         = j.fence + 1,
        lease_until   = NULL,
        available_at  = CASE WHEN d.terminal_class IS NULL
                            THEN now() + d.delay_ms * interval '1 millisecond'
                            ELSE j.available_at END,
        error_class   = coalesce(d.terminal_class, 'lease_expired'),
        last_error    = 'lease of worker ' || d.lease_owner || ' expired during attempt ' || j.attempt
                        || CASE d.terminal_class
                               WHEN 'deadline' THEN '; no time left before the deadline'
                               WHEN 'lease_expired' THEN '; no attempts left'
                               ELSE ''
                           END,
        finished_at   = CASE WHEN d.terminal_class IS NULL THEN NULL ELSE now() END,
        state_version = j.state_version + 1,
        updated_at    = now()
    FROM decided AS d
    WHERE j.id = d.id
    RETURNING j.id, j.tenant, j.kind, j.queue, j.state, j.state_version, j.attempt, j.fence,
        j.lease_owner, j.attempted_at, j.available_at, j.error_class, j.last_error
),
attempt AS (
    INSERT INTO /*schema*/job_attempts (
        job_id, attempt, fence, worker, started_at, outcome, error_class, error, retry_at, uncertain
    )
    SELECT r.id, r.attempt, r.fence - 1, r.lease_owner, r.attempted_at, 'lease_expired',
        r.error_class, r.last_error, CASE WHEN r.state = 'RETRY_SCHEDULED' THEN r.available_at END, true
    FROM reaped AS r
    ON CONFLICT (job_id, attempt) DO NOTHING
),

event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT gen_random_uuid(), r.id, $8, r.id::text, r.kind || '.dead_lettered',
        jsonb_build_object(
            'job_id', r.id, 'tenant', r.tenant, 'kind', r.kind, 'queue', r.queue,
            'state', r.state, 'state_version', r.state_version, 'attempt', r.attempt,
            'error_class', r.error_class)
    FROM reaped AS r
    WHERE r.state = 'FAILED_TERMINAL'
)
SELECT count(*) FILTER (WHERE state = 'RETRY_SCHEDULED'), count(*) FILTER (WHERE state = 'FAILED_TERMINAL')
FROM reaped;

-- name: FailExpiredDeadlines
-- Fails up to $1 waiting jobs whose deadline has passed, found through
-- jobs_deadline_idx, with class 'deadline' and a dead-letter event.
WITH due AS (
    SELECT id
    FROM /*schema*/jobs
    WHERE state IN ('READY', 'RETRY_SCHEDULED')
        AND deadline_at IS NOT NULL
        AND deadline_at <= now()
    ORDER BY deadline_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE /*schema*/jobs AS j
    SET state         = 'FAILED_TERMINAL',
        error_class   = 'deadline',
        last_error    = 'the deadline passed before attempt ' || (j.attempt + 1) || ' could start',
        finished_at   = now(),
        state_version = j.state_version + 1,
        updated_at    = now()
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.tenant, j.kind, j.queue, j.state, j.state_version, j.attempt, j.error_class
),
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT gen_random_uuid(), f.id, $2, f.id::text, f.kind || '.dead_lettered',
        jsonb_build_object(
            'job_id', f.id, 'tenant', f.tenant, 'kind', f.kind, 'queue', f.queue,
            'state', f.state, 'state_version', f.state_version, 'attempt', f.attempt,
            'error_class', f.error_class)
    FROM failed AS f
)
SELECT count(*) FROM failed;

-- name: ReplayJob
-- A new job from a finished one of the same tenant, linked by replay_of and
-- recording who asked and why. The old row is only read, never changed. The
-- new job has no idempotency key: the old job keeps its own.
WITH source AS (
    SELECT *
    FROM /*schema*/jobs
    WHERE tenant = $1 AND id = $2
        AND state IN ('FAILED_TERMINAL', 'REVIEW_REQUIRED', 'CANCELLED')
),
job AS (
    INSERT INTO /*schema*/jobs (
        id, tenant, kind, queue, priority, payload, group_key, max_attempts,
        deadline_at, estimated_tokens, replay_of, replayed_by, replay_reason
    )
    SELECT $3, tenant, kind, queue, priority, payload, group_key, max_attempts,
        $4, estimated_tokens, id, $5, $6
    FROM source
    RETURNING
        /*job_columns*/
),
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT $7, job.id, $8, job.id::text, job.kind || '.requested',
        jsonb_build_object(
            'job_id', job.id, 'tenant', job.tenant, 'kind', job.kind, 'queue', job.queue,
            'state', job.state, 'state_version', job.state_version, 'attempt', job.attempt,
            'replay_of', job.replay_of)
    FROM job
)
SELECT
    /*job_columns*/
FROM job
WHERE $9::text = '' OR pg_notify($9, job.queue) IS NOT NULL;

-- name: ListAttempts
-- A tenant's job's attempts in order: the recorded ones, then the live one,
-- which its job row describes. The join keeps the read tenant-scoped.
SELECT a.job_id, a.attempt, a.fence, a.worker, a.started_at, a.ended_at, a.outcome,
    a.error_class, a.error, a.retry_at, a.input_tokens, a.output_tokens, a.uncertain
FROM /*schema*/job_attempts AS a
JOIN /*schema*/jobs AS j ON j.id = a.job_id
WHERE j.tenant = $1 AND a.job_id = $2
UNION ALL
SELECT id, attempt, fence, lease_owner, attempted_at, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, false
FROM /*schema*/jobs
WHERE tenant = $1 AND id = $2 AND state = 'RUNNING'
ORDER BY 2;
