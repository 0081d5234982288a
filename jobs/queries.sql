-- Queries of the job store. Tables are written /*schema*/name; the store
-- renders them for its schema once, at construction.

-- fragment: job_columns
-- Every job query returns these columns in this order; scanJob reads them.
id, tenant, kind, queue, priority, idempotency_key, request_hash, payload,
group_key, state, attempt, max_attempts, fence, lease_owner, lease_until, attempted_at,
available_at, deadline_at, state_version, estimated_tokens, result,
error_class, last_error, replay_of, replayed_by, replay_reason,
cancel_requested_at, created_at, updated_at, finished_at, trace_parent, batch_id,
reuse_key, reuse_shared, reuse_ttl_ms, reused_from

-- fragment: accepted_job_columns
-- The columns InsertJobs and InsertJob write, in the order of their values.
id, tenant, kind, queue, priority,
idempotency_key, request_hash, payload, group_key, max_attempts,
available_at, deadline_at, estimated_tokens, trace_parent, events, batch_id,
reuse_key, reuse_shared, reuse_ttl_ms

-- block: next_event_seq
-- An event's seq, taken from the outbox's identity sequence by the
-- statement that writes it (see write_events), so that events of both
-- outbox tables share one write order. The sequence is looked up once per
-- statement (an InitPlan), not per event: pg_get_serial_sequence reads the
-- catalog on every call (a few percent of a completion of 500 jobs).
nextval((SELECT pg_get_serial_sequence('/*schema*/outbox', 'seq')::regclass)) AS seq

-- block: write_events
-- A statement's events, from its CTE new_events (seq, event_id,
-- aggregate_id, topic, key, event_type, payload, headers), written as the
-- outbox package writes them: one event as a single-event row of outbox
-- (it costs the relay less than a batch row of one), more as one batch row
-- of outbox_batches, in the shape of outbox.Store.WriteBatch
-- (outbox/batches.sql, InsertBatch; migration 0021). A batch row of tens of
-- events writes about a sixth of the WAL per event, and costs the relay
-- next to nothing. The seqs were taken in new_events, so both inserts
-- keep them. A batch row's events are json text, built with json_agg as
-- InsertBatch builds them (migration 0022): a NULL aggregate or key is a
-- JSON null, and empty headers are left out.
event_row AS (
    INSERT INTO /*schema*/outbox (seq, event_id, aggregate_id, topic, key, event_type, payload, headers)
    OVERRIDING SYSTEM VALUE
    SELECT seq, event_id, aggregate_id, topic, key, event_type, payload, headers
    FROM new_events
    WHERE (SELECT count(*) FROM new_events) = 1
),
event_batch AS (
    INSERT INTO /*schema*/outbox_batches (first_seq, last_seq, event_count, events)
    SELECT min(seq), max(seq), count(*), json_agg(
        CASE WHEN headers = '{}'
            THEN json_build_object('seq', seq, 'id', event_id, 'topic', topic, 'type', event_type, 'payload', payload,
                'aggregate', aggregate_id, 'key', key)
            ELSE json_build_object('seq', seq, 'id', event_id, 'topic', topic, 'type', event_type, 'payload', payload,
                'aggregate', aggregate_id, 'key', key, 'headers', headers)
        END
        ORDER BY seq)
    FROM new_events
    HAVING count(*) > 1
)

-- block: requested_event
-- A job's "<kind>.requested" event's type, payload and headers, from the
-- CTE job and the trace parent $18 (InsertJobs and InsertJob).
job.kind || '.requested' AS event_type,
jsonb_build_object(
    'job_id', job.id, 'tenant', job.tenant, 'kind', job.kind, 'queue', job.queue,
    'state', job.state, 'state_version', job.state_version, 'attempt', job.attempt)
    || CASE WHEN job.batch_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('batch_id', job.batch_id) END AS payload,
CASE WHEN $18::text IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('traceparent', $18::text) END AS headers

-- block: activate_tenant
-- The ON CONFLICT of an insert into tenant_queues AS q that makes a tenant
-- active: an idle row is woken and starts from the floor given, if that
-- is later than its own vtime; an active row is left alone (InsertJobs and
-- InsertJob).
ON CONFLICT (queue, tenant) DO UPDATE
SET idle       = false,
    vtime      = greatest(q.vtime, excluded.vtime),
    updated_at = now()
WHERE q.idle

-- name: InsertJobs
-- Inserts a batch of jobs and, in the same statement, one "<kind>.requested"
-- outbox event per job actually inserted (one batch row for all of them
-- when there are several, see write_events). One statement is atomic even on a
-- pool, and costs one round trip. Each job's keys go to job_keys first; a
-- key already taken by the same tenant inserts nothing there (ON CONFLICT DO
-- NOTHING waits for a concurrent inserter of that key to finish, so a racing
-- duplicate never slips in), and only jobs whose keys went in are inserted;
-- the caller then reads the existing job with SelectJobsByIdempotencyKey.
-- (job_keys says why keys live apart from jobs.) $18 is the W3C
-- traceparent of the accepting span (NULL outside a trace): stored on each
-- job for its attempts' spans, and sent as the requested event's header.
-- $19 are the kinds whose jobs write no lifecycle events
-- (Config.KindsWithoutEvents): their jobs are stored with events = false,
-- which every later transition reads, and get no requested event. $20 is
-- the batch the jobs belong to (EnqueueBatch), NULL outside one. $21 to
-- $23 are each job's reuse key, scope and TTL (jobs.Reuse), NULL for a
-- job that does not opt in.
WITH input AS (
    SELECT *
    FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::smallint[],
        $6::text[], $7::text[], $8::text[], $9::text[], $10::integer[],
        $11::timestamptz[], $12::timestamptz[], $13::bigint[], $14::uuid[],
        $21::text[], $22::boolean[], $23::bigint[]
    ) AS input (
        id, tenant, kind, queue, priority,
        idempotency_key, request_hash, payload, group_key, max_attempts,
        available_at, deadline_at, estimated_tokens, event_id,
        reuse_key, reuse_shared, reuse_ttl_ms
    )
),
-- Keyless jobs' rows cannot conflict and are inserted plainly: ON CONFLICT
-- makes every row a speculative insertion, which logs a second WAL record
-- per row to confirm it.
keyed AS (
    INSERT INTO /*schema*/job_keys (tenant, id, idempotency_key)
    SELECT tenant, id, idempotency_key
    FROM input
    WHERE idempotency_key IS NOT NULL
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
),
keyless AS (
    INSERT INTO /*schema*/job_keys (tenant, id)
    SELECT tenant, id
    FROM input
    WHERE idempotency_key IS NULL
    RETURNING id
),
job AS (
    INSERT INTO /*schema*/jobs (/*accepted_job_columns*/)
    SELECT
        i.id, i.tenant, i.kind, i.queue, i.priority,
        i.idempotency_key, i.request_hash, i.payload::jsonb, i.group_key, i.max_attempts,
        coalesce(i.available_at, now()), i.deadline_at, i.estimated_tokens, $18::text,
        NOT (i.kind = ANY ($19::text[])), $20::uuid,
        i.reuse_key, i.reuse_shared, i.reuse_ttl_ms
    FROM input AS i
    WHERE i.id IN (SELECT id FROM keyed UNION ALL SELECT id FROM keyless)
    RETURNING
        /*job_columns*/,
        events
),
new_events AS MATERIALIZED (
    SELECT /*next_event_seq*/, input.event_id, job.id AS aggregate_id, $15::text AS topic, job.id::text AS key,
        /*requested_event*/
    FROM job JOIN input ON input.id = job.id
    WHERE job.events
),
/*write_events*/,
-- Makes the jobs' tenants active in their queues (see tenant_queues). Only a
-- tenant not already active is written: the NOT EXISTS probe keeps the
-- common case free of row locks, so concurrent enqueuers of one tenant never
-- queue behind each other, and leaves inactive empty, so the floor below is
-- not read at all. Rows are written in (queue, tenant) order, as every
-- statement that waits on these rows locks them, so two such statements
-- cannot deadlock.
inactive AS MATERIALIZED (
    SELECT a.queue, a.tenant
    FROM (SELECT DISTINCT queue, tenant FROM job) AS a
    WHERE NOT EXISTS (
        SELECT 1 FROM /*schema*/tenant_queues AS t
        WHERE t.queue = a.queue AND t.tenant = a.tenant AND NOT t.idle)
),
-- The virtual time a tenant becoming active starts from: the lowest of the
-- queue's active tenants (their "now"), so a tenant that was idle cannot
-- bank credit and starve the others when it returns; 0 when none is active.
-- One entry of tenant_queues_vtime_idx per queue, read once per queue:
-- read per row, each read would step over the index entries of the rows
-- this statement already inserted (invisible to it, but in the index).
-- Inline rather than through active_vtime_floor (migration 0003):
-- PostgreSQL parses and plans a SQL function's body on every execution of
-- the statement that calls it, which cost an enqueue more than the rest of
-- its execution. The statements that wake idle tenants still call it:
-- CompleteJobs only when it wakes one, WakeIdleTenants once per sweep.
floor AS MATERIALIZED (
    SELECT q.queue, coalesce((
        SELECT min(t.vtime) FROM /*schema*/tenant_queues AS t
        WHERE t.queue = q.queue AND NOT t.idle), 0) AS vtime
    FROM (SELECT DISTINCT queue FROM inactive) AS q
),
activate AS (
    INSERT INTO /*schema*/tenant_queues AS q (queue, tenant, vtime)
    SELECT a.queue, a.tenant, f.vtime
    FROM inactive AS a
    JOIN floor AS f ON f.queue = a.queue
    ORDER BY a.queue, a.tenant
    /*activate_tenant*/
)
SELECT
    /*job_columns*/
FROM job
-- Wake runners on commit for the queues in $17 (the store's notify limiter
-- chose them). pg_notify returns void, which IS NOT NULL; calling it in
-- WHERE runs it once per inserted job of those queues, and Postgres folds
-- identical notifications within a transaction into one.
WHERE NOT (job.queue = ANY ($17::text[])) OR pg_notify($16, job.queue) IS NOT NULL;

-- name: InsertJob
-- InsertJobs for one job (Enqueue's common case): the same rows, written
-- the same way, from scalar arguments in InsertJobs' order. Its plan has
-- no unnest, no joins between CTEs and no outbox_batches insert (opened
-- with its indexes on every execution even when it writes nothing), and its
-- event takes its seq from the outbox's identity default instead of a
-- pg_get_serial_sequence lookup: PostgreSQL spends about two thirds of
-- the time InsertJobs takes for one element (one connection enqueueing in a
-- loop: 390 against 580 µs a call, commit included). $19 says whether the
-- job writes lifecycle events, $17 whether to NOTIFY its queue.
WITH keyed AS (
    INSERT INTO /*schema*/job_keys (tenant, id, idempotency_key)
    SELECT $2::text, $1::uuid, $6::text
    WHERE $6::text IS NOT NULL
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
),
keyless AS (
    INSERT INTO /*schema*/job_keys (tenant, id)
    SELECT $2::text, $1::uuid
    WHERE $6::text IS NULL
    RETURNING id
),
job AS (
    INSERT INTO /*schema*/jobs (/*accepted_job_columns*/)
    SELECT
        $1::uuid, $2::text, $3::text, $4::text, $5::smallint,
        $6::text, $7::text, $8::jsonb, $9::text, $10::integer,
        coalesce($11::timestamptz, now()), $12::timestamptz, $13::bigint, $18::text,
        $19::boolean, $20::uuid,
        $21::text, $22::boolean, $23::bigint
    WHERE EXISTS (SELECT FROM keyed) OR EXISTS (SELECT FROM keyless)
    RETURNING
        /*job_columns*/,
        events
),
event_row AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload, headers)
    SELECT $14::uuid, job.id, $15::text, job.id::text,
        /*requested_event*/
    FROM job
    WHERE job.events
),
-- The job's tenant made active in its queue, as in InsertJobs: the NOT
-- EXISTS probe keeps the common case free of row locks, and the floor is
-- read only for a tenant becoming active (the select list is computed for
-- rows the WHERE keeps).
activate AS (
    INSERT INTO /*schema*/tenant_queues AS q (queue, tenant, vtime)
    SELECT job.queue, job.tenant, coalesce((
        SELECT min(t.vtime) FROM /*schema*/tenant_queues AS t
        WHERE t.queue = job.queue AND NOT t.idle), 0)
    FROM job
    WHERE NOT EXISTS (
        SELECT 1 FROM /*schema*/tenant_queues AS t
        WHERE t.queue = job.queue AND t.tenant = job.tenant AND NOT t.idle)
    /*activate_tenant*/
)
SELECT
    /*job_columns*/
FROM job
-- NOTIFY as in InsertJobs.
WHERE NOT $17::boolean OR pg_notify($16, job.queue) IS NOT NULL;

-- name: SelectJobsByIdempotencyKey
-- The jobs holding the given (tenant, key) pairs, found through
-- job_keys_idempotency_idx (the IS NOT NULL lets the planner use that
-- partial index), then the primary key.
SELECT
    /*job_columns j*/
FROM /*schema*/job_keys AS k
JOIN /*schema*/jobs AS j ON j.id = k.id
WHERE (k.tenant, k.idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
    AND k.idempotency_key IS NOT NULL;

-- name: GetJob
-- Every read is tenant-scoped: another tenant's id finds nothing.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE tenant = $1 AND id = $2;

-- name: ListJobs
-- Newest first with keyset pagination on the time-ordered id: walks the
-- tenant's range of job_keys' primary key backwards and reads each job
-- through jobs' primary key; state and kind filters are applied on the way.
SELECT
    /*job_columns j*/
FROM /*schema*/job_keys AS k
JOIN /*schema*/jobs AS j ON j.id = k.id
WHERE k.tenant = $1
    AND (cardinality($2::text[]) = 0 OR j.state = ANY ($2::text[]))
    AND ($3::text = '' OR j.kind = $3::text)
    AND ($4::uuid IS NULL OR k.id < $4::uuid)
ORDER BY k.tenant, k.id DESC
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
        /*job_columns*/,
        events
),
-- The batch progress of the jobs this statement finished: batch_jobs,
-- then the batch_progress block (batches.sql).
batch_jobs AS (
    SELECT batch_id, state FROM changed
    WHERE batch_id IS NOT NULL AND state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
),
/*batch_progress*/
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT $3, id, $4, id::text, kind || '.cancelled',
        jsonb_build_object(
            'job_id', id, 'tenant', tenant, 'kind', kind, 'queue', queue,
            'state', state, 'state_version', state_version, 'attempt', attempt)
            || CASE WHEN batch_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('batch_id', batch_id) END
    FROM changed
    WHERE state = 'CANCELLED' AND events
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
-- now, at a cost that follows the backlog and the recent rate, never the
-- history (llmq stats must stay fast with millions of finished jobs):
--   - waiting jobs (READY, RETRY_SCHEDULED), exactly: jobs_tenant_claim_idx,
--     whose predicate is exactly those states, holds queue and available_at;
--     the state comes from the heap, one visit per waiting job;
--   - running jobs, exactly: an index-only scan of jobs_running_tenant_idx
--     (tenant, queue), partial on RUNNING (the whole index: it holds only
--     the running jobs);
--   - finished jobs only within the last minute (StatsWindow): a range of
--     jobs_finished_idx (state, finished_at) per finished state, one heap
--     visit per job for its queue. A count of every finished job would read
--     the whole history.
-- Each branch names its states and the window as constants, not
-- parameters: the planner proves the partial indexes' predicates from
-- them, and estimates the window's range from now() even in a generic plan
-- (a parameter would be estimated at a third of the history, and could
-- turn the last branch into a sequential scan). A queue whose jobs all finished
-- before the window has no row.
SELECT queue, state, count(*),
    coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now())), 0)::float8
FROM /*schema*/jobs
WHERE state IN ('READY', 'RETRY_SCHEDULED')
GROUP BY queue, state
UNION ALL
SELECT queue, 'RUNNING', count(*), 0
FROM /*schema*/jobs
WHERE state = 'RUNNING'
GROUP BY queue
UNION ALL
SELECT queue, state, count(*), 0
FROM /*schema*/jobs
WHERE state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
    AND finished_at > now() - interval '1 minute'
GROUP BY queue, state
ORDER BY 1, 2;

-- name: QueueDepth
-- The unfinished jobs of every queue, for the observable gauges: waiting
-- jobs split into runnable now and scheduled for later, with the age of the
-- oldest runnable one, then running jobs. Finished jobs are not counted:
-- they pile up forever, and counting them would read the table's history.
-- The first branch is an index-only scan of jobs_tenant_claim_idx, whose
-- predicate is exactly the waiting states and which holds queue and
-- available_at; the second one of jobs_running_tenant_idx. Both read one
-- index entry per unfinished job and no heap page that the visibility map
-- marks all-visible: the cost grows with the backlog, never with history.
SELECT queue,
    count(*) FILTER (WHERE available_at <= now()),
    count(*) FILTER (WHERE available_at > now()),
    0::bigint,
    coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now())), 0)::float8
FROM /*schema*/jobs
WHERE state IN ('READY', 'RETRY_SCHEDULED')
GROUP BY queue
UNION ALL
SELECT queue, 0, 0, count(*), 0
FROM /*schema*/jobs
WHERE state = 'RUNNING'
GROUP BY queue;

-- name: LockClaimTenants
-- The first statement of a claim transaction: locks up to $2 active tenants
-- of queue $1, lowest virtual time first, and reads their weights, caps and
-- (for capped tenants) how many jobs they have running. The scan walks
-- tenant_queues_vtime_idx, which holds only active tenants, so it reads $2
-- rows whatever the backlog or the number of tenants. SKIP LOCKED: a tenant
-- another runner is claiming for is skipped, not waited for. A claim waits
-- only for a job's row (ClaimJobs), and at most its lock_timeout, shorter
-- than deadlock_timeout: a claim in a deadlock gives up before it is
-- found, and the other transaction goes on. The running count
-- here is a hint for sharing out the batch; ClaimJobs counts again under
-- the lock.
WITH locked AS (
    SELECT q.tenant, q.vtime
    FROM /*schema*/tenant_queues AS q
    WHERE q.queue = $1 AND NOT q.idle
    ORDER BY q.vtime, q.tenant
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
defaults AS (
    SELECT weight, max_running FROM /*schema*/tenant_limits WHERE tenant = ''
)
SELECT l.tenant, l.vtime,
    coalesce(t.weight, (SELECT weight FROM defaults), 1) AS weight,
    coalesce(t.max_running, (SELECT max_running FROM defaults), 0) AS max_running,
    CASE WHEN coalesce(t.max_running, (SELECT max_running FROM defaults), 0) > 0 THEN (
        SELECT count(*) FROM /*schema*/jobs AS r
        WHERE r.queue = $1 AND r.tenant = l.tenant AND r.state = 'RUNNING'
    ) ELSE 0 END AS running
FROM locked AS l
LEFT JOIN /*schema*/tenant_limits AS t ON t.tenant = l.tenant
ORDER BY l.vtime, l.tenant;

-- block: claim_share
-- The tenants' shares and the room under their caps (see ClaimJobs).
share AS (
    SELECT a.tenant, a.hi, a.lo, a.weight,
        -- NULL for an uncapped tenant: least() ignores it.
        CASE WHEN a.cap > 0 THEN greatest(a.cap - (
            SELECT count(*) FROM /*schema*/jobs AS r
            WHERE r.queue = $1 AND r.tenant = a.tenant AND r.state = 'RUNNING'
        ), 0) END AS room
    FROM unnest($2::text[], $3::integer[], $4::integer[], $5::integer[], $6::float8[])
        AS a (tenant, hi, lo, cap, weight)
),

-- block: reuse_probe
-- Result reuse (jobs.Reuse; migration 0025), for a waiting job j with a
-- reuse key: one probe of jobs_reuse_idx for its key, which holds the
-- running jobs with a key and the computed (not themselves reused)
-- successes. It reads that key's entries and keeps those of j's kind and
-- scope (a shared key matches shared jobs of any tenant; a tenant key only
-- the tenant's own): a running one first, else the newest success within
-- j's TTL that no operator invalidated. The invalidations are looked at
-- only when the table holds any (its emptiness is read once per
-- statement): each is a cut in time, so a result whose attempt started
-- at or before an invalidation covering it is never taken. A job without a key probes
-- nothing (the one-time filter on j.reuse_key).
        LEFT JOIN LATERAL (
            SELECT s.state, s.id, s.result
            FROM /*schema*/jobs AS s
            WHERE j.reuse_key IS NOT NULL
                AND s.reuse_key = j.reuse_key
                AND s.kind = j.kind AND s.reuse_shared = j.reuse_shared
                AND (j.reuse_shared OR s.tenant = j.tenant)
                AND (s.state = 'RUNNING' OR (s.state = 'SUCCEEDED' AND s.reused_from IS NULL
                    AND s.finished_at >= now() - j.reuse_ttl_ms * interval '1 millisecond'
                    AND (NOT EXISTS (SELECT FROM /*schema*/job_reuse_invalidations) OR NOT EXISTS (
                        SELECT 1 FROM /*schema*/job_reuse_invalidations AS v
                        WHERE v.kind = s.kind AND v.invalidated_at >= s.attempted_at
                            AND (v.reuse_key IS NULL OR v.reuse_key = s.reuse_key)
                            AND (v.tenant IS NULL OR v.tenant = s.tenant)))))
            ORDER BY s.state = 'RUNNING' DESC, s.finished_at DESC
            LIMIT 1
        ) AS src ON true

-- block: urgent_jobs
-- A tenant's share in priority order (see ClaimJobs), with what its
-- reuse_probe found: a job whose key is running is passed over (it waits
-- for that job's result), one whose key has a result to take carries it.
        SELECT j.id, j.tenant, j.kind, j.reuse_key, j.reuse_shared, src.id AS source_id, src.result AS source_result
        FROM /*schema*/jobs AS j
/*reuse_probe*/
        WHERE j.queue = $1 AND j.tenant = a.tenant
            AND j.state IN ('READY', 'RETRY_SCHEDULED')
            AND j.available_at <= now()
            AND (j.deadline_at IS NULL OR j.deadline_at > now())
            AND j.kind = ANY ($9::text[])
            AND (j.group_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM /*schema*/jobs AS g
                WHERE g.tenant = j.tenant AND g.group_key = j.group_key AND g.id < j.id
                    AND g.group_key IS NOT NULL AND g.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')))
            AND (src.state IS NULL OR src.state = 'SUCCEEDED')
        ORDER BY j.priority, j.available_at, j.id
        LIMIT least(a.hi, a.room)

-- block: relaxed_jobs
-- The low-priority share reads the same tenant's least urgent class with
-- eligible work (found by one descent of jobs_tenant_claim_idx), oldest
-- first, leaving out what urgent took (it may hold jobs of that class too).
        SELECT j.id, j.tenant, j.kind, j.reuse_key, j.reuse_shared, src.id AS source_id, src.result AS source_result
        FROM /*schema*/jobs AS j
/*reuse_probe*/
        WHERE j.queue = $1 AND j.tenant = a.tenant
            AND j.priority = (
                SELECT max(x.priority) FROM /*schema*/jobs AS x
                WHERE x.queue = $1 AND x.tenant = a.tenant
                    AND x.state IN ('READY', 'RETRY_SCHEDULED')
                    AND x.available_at <= now())
            AND j.state IN ('READY', 'RETRY_SCHEDULED')
            AND j.available_at <= now()
            AND (j.deadline_at IS NULL OR j.deadline_at > now())
            AND j.kind = ANY ($9::text[])
            AND (j.group_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM /*schema*/jobs AS g
                WHERE g.tenant = j.tenant AND g.group_key = j.group_key AND g.id < j.id
                    AND g.group_key IS NOT NULL AND g.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')))
            AND (src.state IS NULL OR src.state = 'SUCCEEDED')
            -- NOT IN over the CTE is a hashed subplan: one probe per row
            -- read. "NOT (id = ANY (ARRAY(...)))" compared each row with
            -- every id urgent took, a tenth of a 500-job claim's time when
            -- urgent took 450. Neither side is ever NULL.
            AND j.id NOT IN (SELECT id FROM urgent)
        ORDER BY j.available_at, j.id
        LIMIT CASE WHEN a.room IS NULL THEN a.lo ELSE least(a.lo, greatest(a.room - a.hi, 0)) END

-- block: claim_jobs
-- The update that claims them, and the tenants' virtual times (see
-- ClaimJobs).
--
-- Result reuse (see reuse_probe): of the picked jobs of one key with no
-- result to take, only the first is claimed; the others wait as those
-- whose key is running do, and take its result once it succeeds, or run
-- themselves if it fails. A picked job with a result to take is claimed
-- and returned with it and its source, and the runner records it as
-- reused without calling its handler.
picked AS MATERIALIZED (
    SELECT * FROM urgent UNION ALL SELECT * FROM relaxed
),
chosen AS (
    SELECT p.id
    FROM picked AS p
    WHERE p.reuse_key IS NULL OR p.source_id IS NOT NULL OR NOT EXISTS (
        SELECT 1 FROM picked AS q
        WHERE q.reuse_key = p.reuse_key AND q.source_id IS NULL AND q.id < p.id
            AND q.kind = p.kind AND q.reuse_shared = p.reuse_shared
            AND (p.reuse_shared OR q.tenant = p.tenant))
),
claimed AS (
    UPDATE /*schema*/jobs AS j
    SET state         = 'RUNNING',
        attempt       = j.attempt + 1,
        fence         = j.fence + 1,
        lease_owner   = $7,
        lease_until   = now() + $8 * interval '1 millisecond',
        attempted_at  = now(),
        state_version = j.state_version + 1,
        updated_at    = now()
    -- The picked ids as an array probe the primary key, whatever the table's
    -- size; a join with the CTEs can be planned as a scan of the whole table.
    WHERE j.id = ANY (ARRAY(SELECT id FROM chosen))
        -- Checked again on the row as a cancel or the deadline sweep
        -- committing beside a lock-free claim left it (see ClaimJobs).
        -- IS TRUE (state is never NULL) keeps jobs_tenant_claim_idx, whose
        -- predicate this would otherwise imply, from serving the update:
        -- planned on a table vacuumed empty, where every index costs the
        -- planner the same, the update read the whole claim index for its
        -- ids instead of probing the primary key (ClaimSettings).
        AND (j.state IN ('READY', 'RETRY_SCHEDULED')) IS TRUE
    RETURNING /*job_columns j*/
),
tally AS MATERIALIZED (
    SELECT a.tenant, a.weight, a.room, a.hi + a.lo AS offered, coalesce(c.taken, 0) AS taken
    FROM share AS a
    LEFT JOIN (SELECT tenant, count(*) AS taken FROM claimed GROUP BY tenant) AS c ON c.tenant = a.tenant
),
advance AS (
    UPDATE /*schema*/tenant_queues AS q
    SET vtime      = q.vtime + t.taken / t.weight,
        idle       = coalesce((t.taken = 0 AND t.offered > 0) OR t.room <= t.taken, false),
        updated_at = now()
    FROM tally AS t
    -- "tenant = ANY" gives the planner the primary-key probe.
    WHERE q.queue = $1 AND q.tenant = ANY ($2::text[])
        AND q.tenant = t.tenant
        AND (t.taken > 0 OR t.offered > 0 OR t.room = 0)
)
SELECT /*job_columns c*/, p.source_id, p.source_result
FROM claimed AS c
LEFT JOIN picked AS p ON p.id = c.id AND p.source_id IS NOT NULL

-- name: ClaimJobs
-- The second statement of a claim transaction, for the tenants
-- LockClaimTenants locked: tenant $2[i] may take $3[i] jobs in priority
-- order and $4[i] more from its least urgent class (the low-priority
-- share), within its cap $5[i] (0: none). Being a new statement, it reads
-- with a fresh snapshot taken after the tenants' locks were granted, so the
-- running count and the group check see every earlier claim of those
-- tenants: caps and group order hold across runners.
--
-- Each tenant's jobs are read from jobs_tenant_claim_idx in (priority,
-- available_at, id) order, LIMIT its share: the cost is the batch size,
-- whatever the backlog. A grouped job is taken only when no earlier job of
-- its group is waiting or running (jobs_group_idx), so a group runs one job
-- at a time in acceptance (id) order; jobs held back by their group are
-- stepped over, so a tenant whose eligible backlog is mostly one group's
-- tail costs a scan of that tail. Deadlines passed are never claimed, and
-- only kinds the worker can run ($9).
--
-- In the same statement: each tenant's virtual time advances by
-- claimed/weight ($6), and a tenant that took nothing of what it was
-- offered, or is at its cap, is marked idle: it leaves the claim's scan
-- until a job of its finishes (CompleteJobs), new work arrives
-- (InsertJobs), or the sweep (WakeIdleTenants) finds work for it. A tenant
-- that took some but fewer than offered stays active, although it may have
-- nothing left: while it is served, an enqueue for it finds it active and
-- writes no tenant row. Marked idle at every short claim, a tenant served as
-- fast as its jobs arrive flapped, and each enqueue locked its row to wake
-- it, queueing behind the others' commits (e2e, one tenant, 32 producers:
-- 2,714 jobs/s on average before, 3,027 after; docs/performance.md). The
-- price is one claim that finds the tenant empty when its work runs out.
--
-- The claim takes no row lock before its update: claims of a tenant never
-- run at once (its tenant_queues row is locked), and a row lock is a WAL
-- record of its own, about 50 bytes a job. What else may write a waiting
-- job is a cancel or the deadline sweep, committed or committing beside
-- this claim, which the update waits for and then rechecks (a job they
-- finished is not claimed); or someone else's session holding its row (an
-- operator's open transaction), which would hold the claim and the tenants
-- it locked. So the claim runs under a short lock_timeout (ClaimSettings),
-- and when that passes the store claims with ClaimJobsSkippingLocked for a
-- while instead (see PostgresStore.Claim). A claim inside the caller's
-- transaction, where the timeout cannot be set for the claim alone,
-- always skips locked rows.
WITH /*claim_share*/
urgent AS (
    SELECT p.*
    FROM share AS a
    CROSS JOIN LATERAL (
/*urgent_jobs*/    ) AS p
),
relaxed AS (
    SELECT p.*
    FROM share AS a
    CROSS JOIN LATERAL (
/*relaxed_jobs*/    ) AS p
    WHERE a.lo > 0
),
/*claim_jobs*/;

-- name: ClaimJobsSkippingLocked
-- ClaimJobs, skipping the jobs whose rows another session holds, at the
-- price of a row lock per claimed job.
WITH /*claim_share*/
urgent AS (
    SELECT p.*
    FROM share AS a
    CROSS JOIN LATERAL (
/*urgent_jobs*/        FOR UPDATE OF j SKIP LOCKED
    ) AS p
),
relaxed AS (
    SELECT p.*
    FROM share AS a
    CROSS JOIN LATERAL (
/*relaxed_jobs*/        FOR UPDATE OF j SKIP LOCKED
    ) AS p
    WHERE a.lo > 0
),
/*claim_jobs*/;

-- name: ClaimSettings
-- A claim's settings in a transaction of its own, for that transaction
-- only: JIT off (the statements' generic cost estimates are high enough to
-- trigger JIT compilation, which costs tens of milliseconds per claim); how
-- long it may idle holding its tenants' locks ($1 ms,
-- Config.ClaimIdleTimeout); how long a lock-free claim (ClaimJobs) waits
-- for a job's row ($2 ms); and no sequential scans (see KeyedPlans).
SELECT set_config('jit', 'off', true),
    set_config('idle_in_transaction_session_timeout', $1::bigint::text, true),
    set_config('lock_timeout', $2::bigint::text, true),
    set_config('enable_seqscan', 'off', true);

-- name: KeyedPlans
-- Sent before the runner's fenced statements (HeartbeatLeases,
-- CompleteJobs, MarkHungAttempts) in the same round trip: no sequential
-- scans for them. A connection keeps a statement's plan until the table's
-- statistics change (autovacuum's analyze, or never on a server without
-- it), and a plan made while jobs held a few rows (a new deployment's
-- first jobs, or a table pruned empty) reads the whole table: the
-- cheapest plan then, and one that stays while a burst fills the table.
-- Measured: 50 jobs run one by one, then 100,000 at once, and 10,000
-- sequential scans read about a billion rows of jobs (docs/performance.md).
-- Every row these statements touch is found by a key, so none needs a
-- sequential scan. The setting in force is kept aside for RestorePlans.
SELECT set_config('llmq.enable_seqscan', current_setting('enable_seqscan'), true),
    set_config('enable_seqscan', 'off', true);

-- name: RestorePlans
-- After a KeyedPlans statement in a caller's transaction (Complete with
-- the runner's OnSucceeded hooks, or a host's own), in the same round trip:
-- puts back the setting KeyedPlans found, so the rest of the transaction
-- plans as it would have.
SELECT set_config('enable_seqscan', current_setting('llmq.enable_seqscan'), true);

-- name: WakeIdleTenants
-- The sweep: marks active again the idle tenants of queue $1, marked idle
-- in the last $2 seconds, that have work eligible now (a retry whose time
-- came, a claim that raced an enqueue). Reads those idle tenants through
-- tenant_queues_idle_idx, one probe of the claim index each. SKIP LOCKED: a
-- tenant being claimed or woken right now is left alone.
WITH due AS (
    SELECT q.tenant
    FROM /*schema*/tenant_queues AS q
    WHERE q.queue = $1 AND q.idle
        AND q.updated_at > now() - make_interval(secs => $2)
        AND EXISTS (
            SELECT 1 FROM /*schema*/jobs AS j
            WHERE j.queue = q.queue AND j.tenant = q.tenant
                AND j.state IN ('READY', 'RETRY_SCHEDULED')
                AND j.available_at <= now())
    ORDER BY q.tenant
    FOR UPDATE SKIP LOCKED
),
-- Read once, before the first update (see InsertJobs).
floor AS MATERIALIZED (
    SELECT /*schema*/active_vtime_floor($1::text) AS vtime
)
UPDATE /*schema*/tenant_queues AS q
SET idle       = false,
    vtime      = greatest(q.vtime, coalesce(floor.vtime, q.vtime)),
    updated_at = now()
FROM due, floor
WHERE q.queue = $1 AND q.tenant = due.tenant;

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

-- name: ListLeases
-- The RUNNING jobs of queue $2 leased to worker $1, read through
-- jobs_running_tenant_idx, the partial index on RUNNING jobs: the cost is
-- the number of jobs running, in every runner, not the table. A runner reads this only after a claim
-- failed, to find jobs a claim leased to it whose reply it never received.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE queue = $2 AND state = 'RUNNING' AND lease_owner = $1;

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
-- clause would let the planner drive the join from an index on RUNNING
-- jobs (every RUNNING job) instead of probing the primary key once per
-- completion, and generic plans did, at a cost growing with concurrency.
-- "id = ANY" gives it the primary-key probe.
--
-- A snooze becomes RETRY_SCHEDULED at now() + delay and raises max_attempts
-- by one, so the attempt it used does not count against the retry budget
-- (the attempt counter itself never goes back). A retry becomes
-- RETRY_SCHEDULED at now() + delay, unless the attempts are used up, or the next attempt plus its reserved margin would end after the
-- deadline (then FAILED_TERMINAL with class 'deadline'). In the same
-- statement: each attempt's row, and the outbox event of each terminal
-- transition. $14 names, for a success that took another job's result
-- instead of calling the handler (jobs.Reuse), that job: it is stored on
-- the job and its attempt, which is recorded as 'reused'; its event is a
-- computed success's. $15, $16 and $17 are what the attempt records of a
-- route (jobs.Completion's Candidate, Model and Moves, the moves as JSON
-- text): written on its row only, NULL for an attempt without a route or
-- without moves, so an attempt that used neither writes no more WAL.
--
-- It returns, per changed job, only what the completion wrote and what
-- others may have written meanwhile (a heartbeat's lease_until, a cancel's
-- cancel_requested_at and state_version), never the payload, and the
-- result only when the completion sent none (the caller has the one it
-- sent): jobs.CompletionResult.Apply lays these over the job as claimed.
-- The CTE's own RETURNING carries only the columns the statements below
-- read, so no payload is copied into it either.
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
        reused_from   = CASE WHEN i.outcome = 'succeeded' THEN i.reused_from ELSE j.reused_from END,
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
        $11::bigint[], $12::uuid[], $14::uuid[], $15::text[], $16::text[],
        $17::text[]
    ) AS i (
        id, fence, outcome, result, error_class,
        error, delay_ms, margin_ms, uncertain, input_tokens,
        output_tokens, event_id, reused_from, candidate, model,
        moves
    )
    WHERE j.id = ANY ($1::uuid[])
        AND j.id = i.id
        AND j.fence = i.fence
    RETURNING
        j.id, j.tenant, j.kind, j.queue, j.state, j.attempt, j.max_attempts, j.fence,
        j.lease_owner, j.lease_until, j.attempted_at, j.available_at, j.state_version,
        j.error_class, j.last_error, j.cancel_requested_at, j.updated_at, j.finished_at,
        j.trace_parent, j.batch_id, j.reused_from,
        CASE WHEN i.result IS NULL THEN j.result END AS kept_result,
        i.outcome AS reported, i.error AS reported_error, i.uncertain, i.input_tokens, i.output_tokens, i.event_id,
        i.candidate, i.model, i.moves,
        j.events
),
-- The batch progress of the jobs this statement finished: batch_jobs,
-- then the batch_progress block (batches.sql).
batch_jobs AS (
    SELECT batch_id, state FROM updated
    WHERE batch_id IS NOT NULL AND state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
),
/*batch_progress*/
attempt AS (
    INSERT INTO /*schema*/job_attempts (
        job_id, attempt, fence, worker, started_at, outcome, error_class, error,
        retry_at, input_tokens, output_tokens, uncertain, reused_from,
        candidate, model, moves
    )
    SELECT id, attempt, fence, lease_owner, attempted_at,
        CASE state
            WHEN 'SUCCEEDED' THEN CASE WHEN reused_from IS NULL THEN 'succeeded' ELSE 'reused' END
            WHEN 'REVIEW_REQUIRED' THEN 'review_required'
            WHEN 'CANCELLED' THEN 'cancelled'
            WHEN 'FAILED_TERMINAL' THEN 'failed'
            ELSE CASE WHEN reported IN ('released', 'snoozed') THEN reported ELSE 'retry_scheduled' END
        END,
        CASE WHEN reported = 'snoozed' THEN NULL ELSE error_class END,
        CASE reported WHEN 'succeeded' THEN NULL WHEN 'snoozed' THEN reported_error ELSE last_error END,
        CASE WHEN state = 'RETRY_SCHEDULED' THEN available_at END,
        input_tokens, output_tokens, uncertain, reused_from,
        candidate, model, moves::jsonb
    FROM updated
),
-- A job's events carry its acceptance's trace context, so their consumers
-- join the trace the attempts are in.
new_events AS MATERIALIZED (
    SELECT /*next_event_seq*/, event_id, id AS aggregate_id, $13::text AS topic, id::text AS key,
        kind || CASE state
            WHEN 'SUCCEEDED' THEN '.completed'
            WHEN 'REVIEW_REQUIRED' THEN '.review_required'
            WHEN 'CANCELLED' THEN '.cancelled'
            WHEN 'RETRY_SCHEDULED' THEN '.retry_scheduled'
            ELSE '.dead_lettered'
        END AS event_type,
        -- json, not jsonb: a batch row holds its events as json text, and
        -- building jsonb only to print it again cost about a fifth of an
        -- event's CPU. A single event's row of outbox takes it as jsonb
        -- (an assignment cast).
        CASE WHEN batch_id IS NULL
            THEN json_build_object('job_id', id, 'tenant', tenant, 'kind', kind, 'queue', queue,
                'state', state, 'state_version', state_version, 'attempt', attempt, 'error_class', error_class)
            ELSE json_build_object('job_id', id, 'tenant', tenant, 'kind', kind, 'queue', queue,
                'state', state, 'state_version', state_version, 'attempt', attempt, 'error_class', error_class,
                'batch_id', batch_id)
        END AS payload,
        CASE WHEN trace_parent IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('traceparent', trace_parent) END AS headers
    FROM updated
    -- A failed attempt's retry is news to whoever watches the job; a release
    -- at shutdown or a snooze is the runner's own business and stays quiet.
    WHERE events
        AND (state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
            OR (state = 'RETRY_SCHEDULED' AND reported = 'retry'))
),
/*write_events*/,
-- A finished attempt frees a slot under its tenant's cap and may unblock
-- the next job of its group: an idle tenant becomes active again. Only idle
-- rows are written (and locked), in (queue, tenant) order, so completers
-- and enqueuers cannot deadlock on them.
idle_tenants AS (
    SELECT t.queue, t.tenant
    FROM /*schema*/tenant_queues AS t
    WHERE (t.queue, t.tenant) IN (SELECT DISTINCT queue, tenant FROM updated)
        AND t.idle
    ORDER BY t.queue, t.tenant
    FOR UPDATE
),
floor AS MATERIALIZED (
    SELECT i.queue, /*schema*/active_vtime_floor(i.queue) AS vtime
    FROM (SELECT DISTINCT queue FROM idle_tenants) AS i
),
wake AS (
    UPDATE /*schema*/tenant_queues AS q
    SET idle       = false,
        vtime      = greatest(q.vtime, coalesce(f.vtime, q.vtime)),
        updated_at = now()
    FROM idle_tenants AS i
    JOIN floor AS f ON f.queue = i.queue
    WHERE q.queue = i.queue AND q.tenant = i.tenant
)
SELECT
    id, state, state_version, fence, max_attempts, available_at, finished_at,
    error_class, last_error, reused_from, updated_at, lease_until, cancel_requested_at,
    kept_result
FROM updated;

-- name: MoveJob
-- Ends the lease of RUNNING job $1 under its fence $2 and moves it to
-- queue $3, runnable at once: the attempt is recorded as snoozed, with $5
-- as its error and $4 as its worker, and, as a snooze does, raises
-- max_attempts by one so it does not count against the retry budget. No
-- lifecycle event: like a snooze, a move is the workers' business (a
-- runner of the new queue hears of it through NOTIFY $6 when it listens,
-- else at its next poll). The job's tenant is made active in the new
-- queue as an enqueue makes it (InsertJob's activate). One row, through
-- the primary key.
WITH moved AS (
    UPDATE /*schema*/jobs AS j
    SET fence         = j.fence + 1,
        state         = 'RETRY_SCHEDULED',
        queue         = $3::text,
        available_at  = now(),
        max_attempts  = j.max_attempts + 1,
        state_version = j.state_version + 1,
        updated_at    = now()
    WHERE j.id = $1 AND j.fence = $2 AND j.state = 'RUNNING'
    RETURNING
        /*job_columns j*/
),
attempt AS (
    INSERT INTO /*schema*/job_attempts (job_id, attempt, fence, worker, started_at, outcome, error, retry_at)
    SELECT id, attempt, fence, $4::text, attempted_at, 'snoozed', $5::text, available_at
    FROM moved
),
activate AS (
    INSERT INTO /*schema*/tenant_queues AS q (queue, tenant, vtime)
    SELECT moved.queue, moved.tenant, coalesce((
        SELECT min(t.vtime) FROM /*schema*/tenant_queues AS t
        WHERE t.queue = moved.queue AND NOT t.idle), 0)
    FROM moved
    WHERE NOT EXISTS (
        SELECT 1 FROM /*schema*/tenant_queues AS t
        WHERE t.queue = moved.queue AND t.tenant = moved.tenant AND NOT t.idle)
    /*activate_tenant*/
)
SELECT
    /*job_columns*/
FROM moved
WHERE pg_notify($6, moved.queue) IS NOT NULL;

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
-- The amended row keeps its error_class: a hung attempt stays of the class
-- 'hung' (ReapExpiredLeases looks for it), whenever its handler returned.
ON CONFLICT (job_id, attempt) DO UPDATE
SET outcome       = 'stale',
    error         = excluded.error || ' (the attempt had ended: ' || a.outcome || coalesce(': ' || a.error, '') || ')',
    input_tokens  = excluded.input_tokens,
    output_tokens = excluded.output_tokens,
    uncertain     = a.uncertain OR excluded.uncertain
-- Only the reaper's record, or the runner's record of a hung attempt
-- (MarkHungAttempts), is amended: an outcome already recorded by this
-- attempt itself (a completion retried after an ambiguous commit) stands.
WHERE a.fence = excluded.fence AND a.outcome IN ('lease_expired', 'hung');

-- name: MarkHungAttempts
-- A runner gives up attempts whose handlers run on past their timeout and
-- grace ($2 ids, $3 fences, of worker $1; $4 the attempts' errors). Each
-- job still under that fence and owner gets a new fence: nothing its hung
-- handler reports later can apply (CompleteJobs matches no row, and
-- MarkStaleAttempts amends this attempt's row). Its row is written now, as
-- 'hung' and uncertain, with the fence the attempt held. The job stays
-- RUNNING with lease_until as it was: nobody renews it, and once it expires
-- ReapExpiredLeases takes the job back under yet another fence. Until then
-- no runner can claim it, so the job never runs twice at once within its
-- lease. Like CompleteJobs, "id = ANY" gives the planner the primary-key
-- probe; the UPDATE locks each row and re-checks the fence on its newest
-- version, so a completion that won the race leaves nothing to mark.
WITH hung AS (
    UPDATE /*schema*/jobs AS j
    SET fence      = j.fence + 1,
        updated_at = now()
    FROM unnest($2::uuid[], $3::bigint[], $4::text[]) AS h (id, fence, error)
    WHERE j.id = ANY ($2::uuid[])
        AND j.id = h.id
        AND j.fence = h.fence
        AND j.lease_owner = $1
    RETURNING j.id, j.attempt, h.fence AS held_fence, j.fence, j.lease_owner, j.attempted_at, h.error
),
attempt AS (
    INSERT INTO /*schema*/job_attempts (
        job_id, attempt, fence, worker, started_at, outcome, error_class, error, uncertain
    )
    SELECT id, attempt, held_fence, lease_owner, attempted_at, 'hung', 'hung', error, true
    FROM hung
    ON CONFLICT (job_id, attempt) DO NOTHING
)
SELECT id, fence FROM hung;

-- name: ReapExpiredLeases
-- Takes back up to $1 jobs whose lease expired (their worker stopped
-- heartbeating), oldest expiry first, skipping rows another reaper or a
-- late completion holds. The running jobs are read through
-- jobs_running_tenant_idx and their lease_until from the heap: no index
-- holds lease_until, so that a heartbeat, which only moves it, can be a
-- heap-only update. The cost is the number of jobs running, in every
-- runner, per pass of the reaper. Each becomes RETRY_SCHEDULED
-- with a bumped fence, so the lost worker can no longer complete it, and a
-- full-jitter backoff (per-kind policies in $4..$6, default $2/$3 ms) — or
-- FAILED_TERMINAL when its attempts are used up or the next attempt plus the
-- margin $7 would end after its deadline. The attempt is marked uncertain:
-- its provider call may have been made and billed. An attempt its runner
-- gave up as hung (MarkHungAttempts wrote its row: one primary-key probe
-- of job_attempts per job taken back) keeps that row, and the job records
-- the class 'hung' instead of 'lease_expired'. The row is found by its
-- class, which MarkStaleAttempts keeps when the hung handler returned
-- before the lease expired and its row became 'stale'.
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
        END AS terminal_class,
        EXISTS (
            SELECT 1 FROM /*schema*/job_attempts AS a
            WHERE a.job_id = j.id AND a.attempt = j.attempt AND a.error_class = 'hung'
        ) AS hung
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
        error_class   = CASE
                            WHEN d.terminal_class = 'deadline' THEN 'deadline'
                            WHEN d.hung THEN 'hung'
                            ELSE 'lease_expired'
                        END,
        last_error    = CASE
                            WHEN d.hung THEN 'attempt ' || j.attempt || ' hung in worker ' || d.lease_owner
                                || ' (still running past its timeout); its abandoned lease expired'
                            ELSE 'lease of worker ' || d.lease_owner || ' expired during attempt ' || j.attempt
                        END
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
        j.lease_owner, j.attempted_at, j.available_at, j.error_class, j.last_error, j.events, j.batch_id
),
-- The batch progress of the jobs this statement finished: batch_jobs,
-- then the batch_progress block (batches.sql).
batch_jobs AS (
    SELECT batch_id, state FROM reaped
    WHERE batch_id IS NOT NULL AND state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
),
/*batch_progress*/
attempt AS (
    INSERT INTO /*schema*/job_attempts (
        job_id, attempt, fence, worker, started_at, outcome, error_class, error, retry_at, uncertain
    )
    SELECT r.id, r.attempt, r.fence - 1, r.lease_owner, r.attempted_at, 'lease_expired',
        r.error_class, r.last_error, CASE WHEN r.state = 'RETRY_SCHEDULED' THEN r.available_at END, true
    FROM reaped AS r
    -- A hung attempt's row (outcome 'hung', or 'stale' once its handler
    -- returned) stays as its runner wrote it, and learns when the job runs
    -- again.
    ON CONFLICT (job_id, attempt) DO UPDATE
    SET retry_at = excluded.retry_at
    WHERE job_attempts.error_class = 'hung'
),

new_events AS MATERIALIZED (
    SELECT /*next_event_seq*/, gen_random_uuid() AS event_id, r.id AS aggregate_id, $8::text AS topic, r.id::text AS key,
        r.kind || '.dead_lettered' AS event_type,
        jsonb_build_object(
            'job_id', r.id, 'tenant', r.tenant, 'kind', r.kind, 'queue', r.queue,
            'state', r.state, 'state_version', r.state_version, 'attempt', r.attempt,
            'error_class', r.error_class)
            || CASE WHEN r.batch_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('batch_id', r.batch_id) END AS payload,
        '{}'::jsonb AS headers
    FROM reaped AS r
    WHERE r.state = 'FAILED_TERMINAL' AND r.events
),
/*write_events*/
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
    RETURNING j.id, j.tenant, j.kind, j.queue, j.state, j.state_version, j.attempt, j.error_class, j.events, j.batch_id
),
-- The batch progress of the jobs this statement finished: batch_jobs,
-- then the batch_progress block (batches.sql).
batch_jobs AS (
    SELECT batch_id, state FROM failed
    WHERE batch_id IS NOT NULL AND state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
),
/*batch_progress*/
new_events AS MATERIALIZED (
    SELECT /*next_event_seq*/, gen_random_uuid() AS event_id, f.id AS aggregate_id, $2::text AS topic, f.id::text AS key,
        f.kind || '.dead_lettered' AS event_type,
        jsonb_build_object(
            'job_id', f.id, 'tenant', f.tenant, 'kind', f.kind, 'queue', f.queue,
            'state', f.state, 'state_version', f.state_version, 'attempt', f.attempt,
            'error_class', f.error_class)
            || CASE WHEN f.batch_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('batch_id', f.batch_id) END AS payload,
        '{}'::jsonb AS headers
    FROM failed AS f
    WHERE f.events
),
/*write_events*/
SELECT count(*) FROM failed;

-- name: ReplayJob
-- A new job from a finished one of the same tenant, linked by replay_of and
-- recording who asked and why. The old row is only read, never changed. The
-- new job has no idempotency key of its own: the old job keeps its own.
-- $10 is the replay key (NULL when the operator asks for another replay):
-- it goes to job_keys with the new job's id, and only if it was free is
-- the job inserted. ON CONFLICT DO NOTHING waits for a concurrent replay of
-- the same job to commit, so of two racing replays one inserts and the
-- other finds the first (SelectJobsByIdempotencyKey, through
-- job_keys_idempotency_idx). A NULL key never conflicts. Its tenant is not
-- made active here: if the tenant is idle, the runners' idle-tenant sweep
-- brings it back within a poll interval, which is soon enough for an
-- operator's replay. The replay writes events only if the source job did
-- and this store's Config.KindsWithoutEvents ($11) does not name the kind:
-- operator tools (llmq jobs replay, the console) build a store without the
-- host's configuration, and their replays must not start writing events
-- that no relay of this host will publish.
WITH source AS (
    SELECT *
    FROM /*schema*/jobs
    WHERE tenant = $1 AND id = $2
        AND state IN ('FAILED_TERMINAL', 'REVIEW_REQUIRED', 'CANCELLED')
),
keyed AS (
    INSERT INTO /*schema*/job_keys (tenant, id, idempotency_key)
    SELECT tenant, $3, $10::text FROM source
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
),
job AS (
    INSERT INTO /*schema*/jobs (
        id, tenant, kind, queue, priority, payload, group_key, max_attempts,
        deadline_at, estimated_tokens, replay_of, replayed_by, replay_reason, events
    )
    SELECT $3, tenant, kind, queue, priority, payload, group_key, max_attempts,
        $4, estimated_tokens, id, $5, $6, events AND NOT (kind = ANY ($11::text[]))
    FROM source
    WHERE EXISTS (SELECT FROM keyed)
    RETURNING
        /*job_columns*/,
        events
),
event AS (
    INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT $7, job.id, $8, job.id::text, job.kind || '.requested',
        jsonb_build_object(
            'job_id', job.id, 'tenant', job.tenant, 'kind', job.kind, 'queue', job.queue,
            'state', job.state, 'state_version', job.state_version, 'attempt', job.attempt,
            'replay_of', job.replay_of)
    FROM job
    WHERE job.events
)
SELECT
    /*job_columns*/
FROM job
WHERE $9::text = '' OR pg_notify($9, job.queue) IS NOT NULL;

-- name: ListAttempts
-- A tenant's job's attempts in order: the recorded ones, then the live one,
-- which its job row describes. The join keeps the read tenant-scoped.
SELECT a.job_id, a.attempt, a.fence, a.worker, a.started_at, a.ended_at, a.outcome,
    a.error_class, a.error, a.retry_at, a.input_tokens, a.output_tokens, a.uncertain, a.reused_from,
    a.candidate, a.model, a.moves
FROM /*schema*/job_attempts AS a
JOIN /*schema*/jobs AS j ON j.id = a.job_id
WHERE j.tenant = $1 AND a.job_id = $2
UNION ALL
SELECT id, attempt, fence, lease_owner, attempted_at, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, false, NULL,
    NULL, NULL, NULL
FROM /*schema*/jobs
WHERE tenant = $1 AND id = $2 AND state = 'RUNNING'
ORDER BY 2;

-- name: UnservedKinds
-- Kinds of queue $1 outside $2 (the kinds a runner has handlers for) with
-- jobs runnable for at least $3 ms, counted among the queue's idle tenants:
-- a tenant whose runnable work is all of kinds no runner claims is marked
-- idle by every claim, so that is where such jobs wait. Idle tenants come
-- from tenant_queues (tenant_queues_idle_idx); each one's waiting jobs from
-- jobs_tenant_claim_idx, at most 1000 per tenant, the kind read from the
-- heap. The cost follows the idle tenants' runnable backlog, not the
-- table: a runner runs it once a minute per queue. Jobs of a tenant that
-- also has work a runner claims are not seen until that work is done.
SELECT u.kind, count(*), coalesce(extract(epoch FROM now() - min(u.available_at)), 0)::float8
FROM /*schema*/tenant_queues AS q
CROSS JOIN LATERAL (
    SELECT j.kind, j.available_at
    FROM /*schema*/jobs AS j
    WHERE j.queue = q.queue AND j.tenant = q.tenant
        AND j.state IN ('READY', 'RETRY_SCHEDULED')
        AND j.available_at <= now() - $3 * interval '1 millisecond'
        AND NOT (j.kind = ANY ($2::text[]))
    LIMIT 1000
) AS u
WHERE q.queue = $1 AND q.idle
GROUP BY u.kind
ORDER BY u.kind;

-- name: SetTenantLimits
INSERT INTO /*schema*/tenant_limits (tenant, weight, max_running)
VALUES ($1, $2, $3)
ON CONFLICT (tenant) DO UPDATE
SET weight = excluded.weight, max_running = excluded.max_running, updated_at = now();

-- name: DeleteTenantLimits
DELETE FROM /*schema*/tenant_limits WHERE tenant = $1;

-- name: GetTenantLimits
-- The tenant's own row if it has one, else the defaults.
SELECT weight, max_running
FROM /*schema*/tenant_limits
WHERE tenant = $1 OR tenant = ''
ORDER BY tenant DESC
LIMIT 1;

-- name: LookupJob
-- Operator reads start here: an operator's tools are not tenant-scoped,
-- while servers answering tenants use the tenant-scoped queries above.
-- A job by id alone, through the primary key.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE id = $1;

-- name: ListDeadLetters
-- Every tenant's FAILED_TERMINAL jobs, most recently finished first. No
-- index serves it: this reads every job row, like QueueStats.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE state = 'FAILED_TERMINAL'
ORDER BY finished_at DESC, id DESC
LIMIT $1;

-- name: TenantBacklogs
-- Per queue and tenant with unfinished work: jobs eligible now, jobs
-- waiting for their time, running jobs and the oldest eligible job's age,
-- with the weight and cap that apply (the tenant's own, else the defaults'
-- row ''). Reads the unfinished jobs only, the waiting ones through
-- jobs_tenant_claim_idx and the running ones through
-- jobs_running_tenant_idx (each branch's state test is exactly one
-- index's predicate, which lets the planner use it), so its cost follows
-- the backlog, not the history.
WITH unfinished AS (
    SELECT queue, tenant, available_at, false AS running
    FROM /*schema*/jobs
    WHERE state IN ('READY', 'RETRY_SCHEDULED')
    UNION ALL
    SELECT queue, tenant, NULL, true
    FROM /*schema*/jobs
    WHERE state = 'RUNNING'
),
backlog AS (
    SELECT queue, tenant,
        count(*) FILTER (WHERE NOT running AND available_at <= now()) AS runnable,
        count(*) FILTER (WHERE NOT running AND available_at > now()) AS scheduled,
        count(*) FILTER (WHERE running) AS running,
        coalesce(extract(epoch FROM now() - min(available_at)
            FILTER (WHERE NOT running AND available_at <= now())), 0)::float8 AS oldest
    FROM unfinished
    GROUP BY queue, tenant
)
SELECT b.queue, b.tenant, b.runnable, b.scheduled, b.running, b.oldest,
    coalesce(own.weight, d.weight, 1), coalesce(own.max_running, d.max_running, 0), own.tenant IS NOT NULL
FROM backlog AS b
LEFT JOIN /*schema*/tenant_limits AS own ON own.tenant = b.tenant
LEFT JOIN /*schema*/tenant_limits AS d ON d.tenant = ''
ORDER BY b.queue, b.tenant;

-- name: KindBacklogs
-- Per queue and kind with unfinished work: jobs eligible now, jobs waiting
-- for their time, running jobs and the oldest eligible job's age. A kind
-- that no runner serves shows as runnable work that only ages. Reads the
-- unfinished jobs only, through the same two indexes as TenantBacklogs.
WITH unfinished AS (
    SELECT queue, kind, available_at, false AS running
    FROM /*schema*/jobs
    WHERE state IN ('READY', 'RETRY_SCHEDULED')
    UNION ALL
    SELECT queue, kind, NULL, true
    FROM /*schema*/jobs
    WHERE state = 'RUNNING'
)
SELECT queue, kind,
    count(*) FILTER (WHERE NOT running AND available_at <= now()),
    count(*) FILTER (WHERE NOT running AND available_at > now()),
    count(*) FILTER (WHERE running),
    coalesce(extract(epoch FROM now() - min(available_at)
        FILTER (WHERE NOT running AND available_at <= now())), 0)::float8
FROM unfinished
GROUP BY queue, kind
ORDER BY queue, kind;

-- name: ListTenantLimits
-- Every stored row: the defaults ('') first, then each tenant's own.
SELECT tenant, weight, max_running
FROM /*schema*/tenant_limits
ORDER BY tenant;
