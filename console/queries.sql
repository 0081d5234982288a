-- The console's reads that the packages' public APIs lack. Every statement
-- here must answer in milliseconds however many jobs the schema holds: each
-- reads through an index, counts stop at a cap (a LIMIT inside the count,
-- shown as "cap+"), and listings read at most a bounded window of index
-- entries per request (a scan limit), handing out a cursor to continue. No
-- statement counts a whole table. $-parameters named "tenant" are '' for
-- every tenant; a tenant-scoped console always passes its tenant.

-- name: Queues
-- The queues that have had work, from tenant_queues (one row per queue and
-- tenant). A loose index scan of its primary key (queue, tenant): one
-- index probe per distinct queue, however many tenants each has.
WITH RECURSIVE q AS (
    (SELECT queue FROM /*schema*/tenant_queues ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM /*schema*/tenant_queues AS t WHERE t.queue > q.queue ORDER BY t.queue LIMIT 1)
    FROM q
    WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL LIMIT 200;

-- name: TenantQueues
-- The queues one tenant has had work in. tenant_queues has no index led by
-- tenant; it holds one small row per (queue, tenant), so this reads the
-- table, whose size follows queues × tenants, never jobs.
SELECT queue FROM /*schema*/tenant_queues WHERE tenant = $1 ORDER BY queue LIMIT 200;

-- name: QueueCounts
-- Per queue ($1): runnable, scheduled and running jobs, each counted up to
-- $2, and the oldest runnable job's eligibility time. Migration 0013 leads
-- both indexes on live jobs with the tenant (jobs_tenant_claim_idx
-- (tenant, queue, priority, available_at, id), partial on the waiting
-- states; jobs_running_tenant_idx (tenant, queue), partial on RUNNING), so
-- a queue is not a range of either, and available_at orders entries only
-- within one (tenant, queue, priority) prefix. So:
--   - waiting: a loose index scan of the claim index finds each (tenant,
--     queue, priority) prefix holding waiting jobs, one probe each, and
--     the prefix's first entry, whose available_at is the prefix's
--     earliest: the oldest runnable job is the least of those at or before
--     now(), exact. The walk stops after $2 prefixes (capped: the counts
--     are then lower bounds and the oldest a bound, which the page says).
--   - runnable: per prefix whose first entry is due, the index range
--     available_at <= now() of that prefix, and scheduled: the range
--     available_at > now(), each read index-only and stopped by a LIMIT
--     $2 per prefix and a LIMIT $2 over the queue's prefixes: entries read
--     are at most $2 plus a probe per prefix, however many jobs are
--     scheduled or runnable (the ranges hold only the entries they count).
--   - running: the same over the (tenant, queue) prefixes of the running
--     index.
-- Cost: the number of (tenant, queue, priority) prefixes with live work
-- (at most $2) plus $2 entries per count, never the backlog or history.
-- Each per-prefix count is ORDER BY available_at, the index's own order
-- there: without it, for a tenant with a large backlog the planner takes a
-- LIMIT over a sequential scan for cheap (it expects matches to be dense),
-- which reads the whole table when they are not. For the same reason the
-- console runs this statement, QueueCountsTenant and TenantRows with
-- sequential and bitmap scans off (rangeScansOnly, reads.go): estimating a
-- prefix's rows from averages, the planner otherwise at times takes a
-- bitmap scan, which reads all of a large prefix to count to the cap.
WITH RECURSIVE waiting (tenant, queue, priority, first_at, depth) AS (
    (SELECT j.tenant, j.queue, j.priority, j.available_at, 1
        FROM /*schema*/jobs AS j
        WHERE j.state IN ('READY', 'RETRY_SCHEDULED')
        ORDER BY j.tenant, j.queue, j.priority, j.available_at
        LIMIT 1)
    UNION ALL
    SELECT n.tenant, n.queue, n.priority, n.available_at, w.depth + 1
    FROM waiting AS w
    CROSS JOIN LATERAL (
        SELECT j.tenant, j.queue, j.priority, j.available_at
        FROM /*schema*/jobs AS j
        WHERE j.state IN ('READY', 'RETRY_SCHEDULED')
            AND (j.tenant, j.queue, j.priority) > (w.tenant, w.queue, w.priority)
        ORDER BY j.tenant, j.queue, j.priority, j.available_at
        LIMIT 1) AS n
    WHERE w.depth < $2
),
running (tenant, queue, depth) AS (
    (SELECT j.tenant, j.queue, 1 FROM /*schema*/jobs AS j
        WHERE j.state = 'RUNNING'
        ORDER BY j.tenant, j.queue
        LIMIT 1)
    UNION ALL
    SELECT n.tenant, n.queue, r.depth + 1
    FROM running AS r
    CROSS JOIN LATERAL (
        SELECT j.tenant, j.queue FROM /*schema*/jobs AS j
        WHERE j.state = 'RUNNING' AND (j.tenant, j.queue) > (r.tenant, r.queue)
        ORDER BY j.tenant, j.queue
        LIMIT 1) AS n
    WHERE r.depth < $2
)
SELECT q.queue,
    (SELECT count(*) FROM (
        SELECT 1 FROM waiting AS w
        CROSS JOIN LATERAL (
            SELECT 1 FROM /*schema*/jobs AS j
            WHERE j.tenant = w.tenant AND j.queue = w.queue AND j.priority = w.priority
                AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at <= now()
            ORDER BY j.available_at
            LIMIT $2) AS x
        WHERE w.queue = q.queue AND w.first_at <= now()
        LIMIT $2) AS c),
    (SELECT min(w.first_at) FROM waiting AS w WHERE w.queue = q.queue AND w.first_at <= now()),
    (SELECT count(*) FROM (
        SELECT 1 FROM waiting AS w
        CROSS JOIN LATERAL (
            SELECT 1 FROM /*schema*/jobs AS j
            WHERE j.tenant = w.tenant AND j.queue = w.queue AND j.priority = w.priority
                AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at > now()
            ORDER BY j.available_at
            LIMIT $2) AS x
        WHERE w.queue = q.queue
        LIMIT $2) AS c),
    (SELECT count(*) FROM (
        SELECT 1 FROM running AS r
        CROSS JOIN LATERAL (
            SELECT 1 FROM /*schema*/jobs AS j
            WHERE j.tenant = r.tenant AND j.queue = r.queue AND j.state = 'RUNNING'
            LIMIT $2) AS x
        WHERE r.queue = q.queue
        LIMIT $2) AS c),
    (SELECT count(*) FROM waiting) >= $2 OR (SELECT count(*) FROM running) >= $2
FROM unnest($1::text[]) AS q (queue)
ORDER BY q.queue;

-- name: QueueCountsTenant
-- QueueCounts for one tenant ($3): the loose scans walk the (queue,
-- priority) prefixes under the tenant's own prefix of the same indexes.
WITH RECURSIVE waiting (queue, priority, first_at, depth) AS (
    (SELECT j.queue, j.priority, j.available_at, 1
        FROM /*schema*/jobs AS j
        WHERE j.tenant = $3::text AND j.state IN ('READY', 'RETRY_SCHEDULED')
        ORDER BY j.queue, j.priority, j.available_at
        LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority, n.available_at, w.depth + 1
    FROM waiting AS w
    CROSS JOIN LATERAL (
        SELECT j.queue, j.priority, j.available_at
        FROM /*schema*/jobs AS j
        WHERE j.tenant = $3::text AND j.state IN ('READY', 'RETRY_SCHEDULED')
            AND (j.queue, j.priority) > (w.queue, w.priority)
        ORDER BY j.queue, j.priority, j.available_at
        LIMIT 1) AS n
    WHERE w.depth < $2
)
SELECT q.queue,
    (SELECT count(*) FROM (
        SELECT 1 FROM waiting AS w
        CROSS JOIN LATERAL (
            SELECT 1 FROM /*schema*/jobs AS j
            WHERE j.tenant = $3::text AND j.queue = w.queue AND j.priority = w.priority
                AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at <= now()
            ORDER BY j.available_at
            LIMIT $2) AS x
        WHERE w.queue = q.queue AND w.first_at <= now()
        LIMIT $2) AS c),
    (SELECT min(w.first_at) FROM waiting AS w WHERE w.queue = q.queue AND w.first_at <= now()),
    (SELECT count(*) FROM (
        SELECT 1 FROM waiting AS w
        CROSS JOIN LATERAL (
            SELECT 1 FROM /*schema*/jobs AS j
            WHERE j.tenant = $3::text AND j.queue = w.queue AND j.priority = w.priority
                AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at > now()
            ORDER BY j.available_at
            LIMIT $2) AS x
        WHERE w.queue = q.queue
        LIMIT $2) AS c),
    (SELECT count(*) FROM (
        SELECT 1 FROM /*schema*/jobs AS j
        WHERE j.tenant = $3::text AND j.queue = q.queue AND j.state = 'RUNNING'
        LIMIT $2) AS c),
    (SELECT count(*) FROM waiting) >= $2
FROM unnest($1::text[]) AS q (queue)
ORDER BY q.queue;

-- name: FinishedPerMinute
-- Jobs finished per minute and terminal state over the last $1 minutes,
-- each count stopping at $2. Reads jobs_finished_idx (state, finished_at;
-- partial on finished jobs): one range per (minute, state), at most $2
-- entries each, index-only where the visibility map allows.
SELECT m.minute, s.state,
    (SELECT count(*) FROM (
        SELECT 1 FROM /*schema*/jobs AS j
        WHERE j.state = s.state AND j.finished_at IS NOT NULL
            AND j.finished_at >= m.minute AND j.finished_at < m.minute + interval '1 minute'
        LIMIT $2) AS c)
FROM generate_series(date_trunc('minute', now()) - ($1::int - 1) * interval '1 minute',
        date_trunc('minute', now()), interval '1 minute') AS m (minute)
CROSS JOIN unnest(ARRAY['SUCCEEDED', 'FAILED_TERMINAL', 'REVIEW_REQUIRED']) AS s (state)
ORDER BY 1, 2;

-- name: FinishedPerMinuteTenant
-- FinishedPerMinute for one tenant ($2), without visiting other tenants'
-- jobs: the tenant's jobs accepted since $3 (a UUIDv7 bound on job_keys'
-- primary key (tenant, id), newest first, at most $4 of them), each read
-- through jobs' primary key, counted by the minute they finished in the
-- last $1 minutes. A job accepted before $3 that finished in the window is
-- not counted: the page says the chart covers recent acceptances.
SELECT date_trunc('minute', j.finished_at), j.state, count(*)
FROM (
    SELECT k.id FROM /*schema*/job_keys AS k
    WHERE k.tenant = $2::text AND k.id >= $3::uuid
    ORDER BY k.id DESC
    LIMIT $4
) AS k
JOIN /*schema*/jobs AS j ON j.id = k.id
WHERE j.finished_at >= date_trunc('minute', now()) - ($1::int - 1) * interval '1 minute'
    AND j.state IN ('SUCCEEDED', 'FAILED_TERMINAL', 'REVIEW_REQUIRED')
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: OutboxLag
-- The unpublished backlog, counted up to $1 through outbox_pending_idx
-- (seq; partial on unpublished events), and the age of its oldest event:
-- the first entry of the same index. Batch rows (migration 0021) count
-- their events, at most $1 rows of outbox_batches_pending_idx read.
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM /*schema*/outbox WHERE published_at IS NULL LIMIT $1) AS c)
        + (SELECT coalesce(sum(event_count), 0) FROM (
            SELECT event_count FROM /*schema*/outbox_batches WHERE published_at IS NULL LIMIT $1) AS b),
    coalesce(extract(epoch FROM now() - least(
        (SELECT created_at FROM /*schema*/outbox WHERE published_at IS NULL ORDER BY seq LIMIT 1),
        (SELECT created_at FROM /*schema*/outbox_batches WHERE published_at IS NULL ORDER BY first_seq LIMIT 1))), 0)::float8;

-- name: Runners
-- Workers holding live leases: RUNNING jobs whose lease has not expired,
-- grouped by holder. No index holds lease_until since migration 0013 (so a
-- heartbeat can be a heap-only update): this reads the running jobs
-- through jobs_running_tenant_idx (tenant, queue; partial on RUNNING),
-- whole, visiting each row, at most $1 of them: running jobs are bounded by
-- the workers' slots, not by the backlog or history.
SELECT lease_owner, count(*), max(attempted_at), max(lease_until)
FROM (
    SELECT lease_owner, attempted_at, lease_until
    FROM /*schema*/jobs
    WHERE state = 'RUNNING' AND lease_until > now()
    LIMIT $1
) AS r
GROUP BY lease_owner
ORDER BY lease_owner;

-- name: PermitHolders
-- Live admission permits by holder and pool. admission_permits holds only
-- unreleased permits (a pool's in-flight calls), so it stays small.
SELECT holder, pool, count(*), max(expires_at)
FROM /*schema*/admission_permits
WHERE expires_at > now()
GROUP BY holder, pool
ORDER BY holder, pool
LIMIT 500;

-- name: ServiceLeases
-- The outbox relays' leader lease and the retention service's lease: one
-- row each, with retention's last pass (the relay records none).
-- A released lease holds '-infinity', which reads as NULL here.
SELECT 'outbox relay', holder, lease_epoch, CASE WHEN isfinite(lease_until) THEN lease_until END, acquired_at, lease_until > now(),
    NULL::timestamptz
FROM /*schema*/outbox_relay_lease
UNION ALL
SELECT 'retention', holder, NULL, CASE WHEN isfinite(lease_until) THEN lease_until END, acquired_at, lease_until > now(),
    last_pass_at
FROM /*schema*/retention_lease;

-- name: FailureRate
-- Per queue, the attempts that ended in the last hour: the failed ones
-- (failed, retry_scheduled) and those that ran a handler (all but
-- released and snoozed), as the LlmqFailureRateHigh alert counts them,
-- among the attempts of the newest jobs accepted since $1 (a UUIDv7 lower
-- bound): job_attempts' primary key (job_id, attempt) read backwards from
-- the newest job, at most $2 entries, no index holding a time. Each
-- attempt in the hour finds its queue by a primary-key probe of jobs. The
-- last column says the $2 entries were all read (the rates are then of a
-- sample: the newest jobs' attempts). A NULL queue row carries only that
-- flag when no attempt ended in the hour.
SELECT a.queue, count(*) FILTER (WHERE a.outcome IN ('failed', 'retry_scheduled')),
    count(*) FILTER (WHERE a.outcome NOT IN ('released', 'snoozed')), bool_or(a.full)
FROM (
    SELECT (SELECT j.queue FROM /*schema*/jobs AS j WHERE j.id = x.job_id) AS queue, x.outcome, x.ended_at, w.full
    FROM (
        SELECT a.job_id, a.outcome, a.ended_at FROM /*schema*/job_attempts AS a
        WHERE a.job_id >= $1::uuid
        ORDER BY a.job_id DESC
        LIMIT $2
    ) AS x
    RIGHT JOIN (SELECT (SELECT count(*) FROM (
        SELECT 1 FROM /*schema*/job_attempts AS a WHERE a.job_id >= $1::uuid LIMIT $2) AS c) >= $2 AS full) AS w
        ON x.ended_at >= now() - interval '1 hour'
) AS a
GROUP BY a.queue
ORDER BY a.queue;

-- name: FailureRateTenant
-- FailureRate for one tenant ($3): its newest jobs accepted since $1,
-- at most $2, from job_keys' primary key (tenant, id), then each one's
-- attempts through job_attempts' primary key and its queue through jobs'.
SELECT a.queue, count(*) FILTER (WHERE a.outcome IN ('failed', 'retry_scheduled')),
    count(*) FILTER (WHERE a.outcome NOT IN ('released', 'snoozed')), bool_or(a.full)
FROM (
    SELECT (SELECT j.queue FROM /*schema*/jobs AS j WHERE j.id = x.job_id) AS queue, x.outcome, x.ended_at, w.full
    FROM (
        SELECT k.id AS job_id, at.outcome, at.ended_at
        FROM (
            SELECT k.id FROM /*schema*/job_keys AS k
            WHERE k.tenant = $3::text AND k.id >= $1::uuid
            ORDER BY k.id DESC
            LIMIT $2
        ) AS k
        CROSS JOIN LATERAL (
            SELECT a.outcome, a.ended_at FROM /*schema*/job_attempts AS a WHERE a.job_id = k.id
        ) AS at
    ) AS x
    RIGHT JOIN (SELECT (SELECT count(*) FROM (
        SELECT 1 FROM /*schema*/job_keys AS k WHERE k.tenant = $3::text AND k.id >= $1::uuid LIMIT $2) AS c) >= $2 AS full) AS w
        ON x.ended_at >= now() - interval '1 hour'
) AS a
GROUP BY a.queue
ORDER BY a.queue;

-- name: TenantRows
-- A page of (queue, tenant) rows from tenant_queues in key order after
-- ($2, $3), $4 rows, among the first $9 rows of the walk (the scan window:
-- a filter matching few rows costs at most $9 primary-key entries; when
-- the page comes back short, TenantWindowEnd tells where the window
-- ended), with the limits that apply (the tenant's own, else the
-- defaults' row ''), the waiting and running counts (each up to $5), the
-- oldest runnable job, and the jobs accepted since $6 (a UUIDv7 lower
-- bound: job_keys' primary key (tenant, id) read index-only, up to $5) and
-- how many of the latest $7 of those finished (a primary-key probe of jobs
-- per key): the last two per tenant, over all its queues, since job_keys
-- does not hold the queue. $1 narrows it to one tenant; $8, an ILIKE
-- pattern whose wildcards the console escaped ('' for none), to the
-- tenants whose name holds the filter's text in any case: it filters the
-- window's rows before any of their counts run.
--
-- Waiting work, per row: a loose index scan of jobs_tenant_claim_idx
-- (tenant, queue, priority, available_at, id) finds each priority the
-- (tenant, queue) has waiting jobs in (one probe per priority present,
-- plus one) and its first entry, the priority's earliest available_at: the
-- oldest runnable job is exact, whatever the backlog. The runnable and
-- scheduled counts are then, per priority, the index ranges available_at
-- <= now() and > now(), read index-only and stopped by LIMIT $5 overall:
-- the entries read are the ones counted, however many are scheduled. The
-- running count is an equality range of jobs_running_tenant_idx (tenant,
-- queue), stopped at $5.
SELECT tq.queue, tq.tenant, tq.idle,
    coalesce(own.weight, d.weight, 1), coalesce(own.max_running, d.max_running, 0), own.tenant IS NOT NULL,
    w.runnable, w.scheduled,
    (SELECT count(*) FROM (
        SELECT 1 FROM /*schema*/jobs AS j
        WHERE j.tenant = tq.tenant AND j.queue = tq.queue AND j.state = 'RUNNING'
        LIMIT $5) AS c),
    w.oldest,
    (SELECT count(*) FROM (
        SELECT 1 FROM /*schema*/job_keys AS k
        WHERE k.tenant = tq.tenant AND k.id >= $6::uuid
        LIMIT $5) AS c),
    (SELECT count(*) FROM (
        SELECT 1 FROM (
            SELECT k.id FROM /*schema*/job_keys AS k
            WHERE k.tenant = tq.tenant AND k.id >= $6::uuid
            ORDER BY k.id DESC
            LIMIT $7) AS k
        JOIN /*schema*/jobs AS j ON j.id = k.id
        WHERE j.finished_at IS NOT NULL) AS c)
FROM (
    SELECT t.queue, t.tenant, t.idle FROM /*schema*/tenant_queues AS t
    WHERE ($1::text = '' OR t.tenant = $1::text)
        AND (t.queue, t.tenant) > ($2::text, $3::text)
    ORDER BY t.queue, t.tenant
    LIMIT $9
) AS tq
LEFT JOIN /*schema*/tenant_limits AS own ON own.tenant = tq.tenant
LEFT JOIN /*schema*/tenant_limits AS d ON d.tenant = ''
CROSS JOIN LATERAL (
    WITH RECURSIVE pr (priority, first_at) AS (
        (SELECT j.priority, j.available_at FROM /*schema*/jobs AS j
            WHERE j.tenant = tq.tenant AND j.queue = tq.queue AND j.state IN ('READY', 'RETRY_SCHEDULED')
            ORDER BY j.priority, j.available_at LIMIT 1)
        UNION ALL
        SELECT n.priority, n.available_at FROM pr CROSS JOIN LATERAL (
            SELECT j.priority, j.available_at FROM /*schema*/jobs AS j
            WHERE j.tenant = tq.tenant AND j.queue = tq.queue AND j.state IN ('READY', 'RETRY_SCHEDULED')
                AND j.priority > pr.priority
            ORDER BY j.priority, j.available_at LIMIT 1) AS n)
    SELECT
        (SELECT count(*) FROM (
            SELECT 1 FROM pr
            CROSS JOIN LATERAL (
                SELECT 1 FROM /*schema*/jobs AS j
                WHERE j.tenant = tq.tenant AND j.queue = tq.queue AND j.priority = pr.priority
                    AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at <= now()
                ORDER BY j.available_at
                LIMIT $5) AS x
            WHERE pr.first_at <= now()
            LIMIT $5) AS c) AS runnable,
        (SELECT count(*) FROM (
            SELECT 1 FROM pr
            CROSS JOIN LATERAL (
                SELECT 1 FROM /*schema*/jobs AS j
                WHERE j.tenant = tq.tenant AND j.queue = tq.queue AND j.priority = pr.priority
                    AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at > now()
                ORDER BY j.available_at
                LIMIT $5) AS x
            LIMIT $5) AS c) AS scheduled,
        (SELECT min(pr.first_at) FROM pr WHERE pr.first_at <= now()) AS oldest
) AS w
WHERE ($8::text = '' OR tq.tenant ILIKE $8::text ESCAPE '\')
ORDER BY tq.queue, tq.tenant
LIMIT $4;

-- name: TenantWindowEnd
-- The last (queue, tenant) of TenantRows' scan window (the $4-th row of
-- tenant_queues' primary key after ($2, $3), tenant $1 or every one's),
-- read index-only; none when the window reached the end.
SELECT queue, tenant FROM /*schema*/tenant_queues
WHERE ($1::text = '' OR tenant = $1::text)
    AND (queue, tenant) > ($2::text, $3::text)
ORDER BY queue, tenant
OFFSET $4 - 1
LIMIT 1;

-- fragment: summary_columns
-- What a listing shows of a job; scanned by scanSummary in this order.
id, tenant, kind, queue, priority, state, attempt, max_attempts, created_at, finished_at,
error_class, last_error, replay_of

-- name: ListJobs
-- Every tenant's jobs newest first, filtered by states ($1), kind ($2) and
-- queue ($3), below the cursor id $4 and at or above id $5 (UUIDv7 ids
-- order by creation time, so the time filter is an id range). The inner
-- query walks jobs' primary key backwards and stops after $6 rows, the
-- scan limit: a filter matching few jobs costs at most $6 rows, not the
-- table. The outer LIMIT ($7) stops as soon as the page is full; the inner
-- query's order is kept, so no sort runs. When the page comes back short,
-- ListScanEnd tells where the window ended, to continue from there.
SELECT /*summary_columns j*/
FROM (
    SELECT * FROM /*schema*/jobs
    WHERE id < $4::uuid AND id >= $5::uuid
    ORDER BY id DESC
    LIMIT $6
) AS j
WHERE (cardinality($1::text[]) = 0 OR j.state = ANY ($1::text[]))
    AND ($2::text = '' OR j.kind = $2::text)
    AND ($3::text = '' OR j.queue = $3::text)
ORDER BY j.id DESC
LIMIT $7;

-- name: ListScanEnd
-- The last id of ListJobs' scan window (the $3-th id below $1 and at or
-- above $2), read index-only from jobs' primary key; none when the window
-- reached the end.
SELECT id FROM /*schema*/jobs
WHERE id < $1::uuid AND id >= $2::uuid
ORDER BY id DESC
OFFSET $3 - 1
LIMIT 1;

-- name: ListTenantJobs
-- ListJobs for one tenant ($8): the window walks job_keys' primary key
-- (tenant, id) backwards, index-only, and each job is read through jobs'
-- primary key (a LATERAL, so the window's order is kept and the outer
-- LIMIT stops the probes).
SELECT /*summary_columns j*/
FROM (
    SELECT k.id FROM /*schema*/job_keys AS k
    WHERE k.tenant = $8::text AND k.id < $4::uuid AND k.id >= $5::uuid
    ORDER BY k.id DESC
    LIMIT $6
) AS k
CROSS JOIN LATERAL (SELECT * FROM /*schema*/jobs AS jj WHERE jj.id = k.id) AS j
WHERE (cardinality($1::text[]) = 0 OR j.state = ANY ($1::text[]))
    AND ($2::text = '' OR j.kind = $2::text)
    AND ($3::text = '' OR j.queue = $3::text)
ORDER BY k.id DESC
LIMIT $7;

-- name: ListTenantScanEnd
-- ListScanEnd for ListTenantJobs' window ($4 is the tenant).
SELECT id FROM /*schema*/job_keys
WHERE tenant = $4::text AND id < $1::uuid AND id >= $2::uuid
ORDER BY id DESC
OFFSET $3 - 1
LIMIT 1;

-- name: ListFinished
-- Jobs in the terminal state $1 (the dead letters, or the jobs awaiting
-- review), most recently finished first, before the cursor ($2, $3) in
-- (finished_at, id) order. The window walks jobs_finished_idx (state,
-- finished_at) backwards from $2 and stops after $4 entries; a batch of
-- completions shares one finished_at, which the id breaks (an incremental
-- sort over the few equal entries). Filters: tenant $5, queue $6, kind $7,
-- finished at or after $8; the page is $9 rows.
SELECT /*summary_columns j*/
FROM (
    SELECT * FROM /*schema*/jobs
    WHERE state = $1::text AND finished_at IS NOT NULL
        AND finished_at <= $2::timestamptz AND finished_at >= $8::timestamptz
        AND (finished_at < $2::timestamptz OR id < $3::uuid)
    ORDER BY finished_at DESC, id DESC
    LIMIT $4
) AS j
WHERE ($5::text = '' OR j.tenant = $5::text)
    AND ($6::text = '' OR j.queue = $6::text)
    AND ($7::text = '' OR j.kind = $7::text)
ORDER BY j.finished_at DESC, j.id DESC
LIMIT $9;

-- name: FinishedScanEnd
-- The last entry of ListFinished's window, to continue from.
SELECT finished_at, id FROM /*schema*/jobs
WHERE state = $1::text AND finished_at IS NOT NULL
    AND finished_at <= $2::timestamptz AND finished_at >= $5::timestamptz
    AND (finished_at < $2::timestamptz OR id < $3::uuid)
ORDER BY finished_at DESC, id DESC
OFFSET $4 - 1
LIMIT 1;

-- name: JobEvents
-- A job's outbox events. The outbox has no index on aggregate_id (by
-- design, see outbox/queries.sql); its event ids are UUIDv7, written when
-- the event is, so the job's events lie in the primary-key range from just
-- before the job was created ($2) to just after it finished ($3). The
-- range is read from both ends, $4 entries from the bottom (the job's
-- first events) and $4 from the top (its latest: a dead letter's, a
-- review's), whatever else was written meanwhile, so a busy outbox cannot
-- hide the latest events behind the first $4. The first column says
-- whether the two windows left a part of the range unread (each full, and
-- apart): the page then says the scan limit was reached. A row with NULL
-- event columns carries that flag when the job has no event.
--
-- Events in batch rows (migration 0021) are found the same way among the
-- batch rows written from $5 to $6 (the same times as $2 and $3), $7 rows
-- from each end of outbox_batches_created_idx, each row's events read out
-- of it; an event split out of its row is read as its copy, above.
WITH lo AS MATERIALIZED (
    SELECT event_id, aggregate_id, seq FROM /*schema*/outbox
    WHERE event_id >= $2::uuid AND event_id <= $3::uuid
    ORDER BY event_id
    LIMIT $4
),
hi AS MATERIALIZED (
    SELECT event_id, aggregate_id, seq FROM /*schema*/outbox
    WHERE event_id >= $2::uuid AND event_id <= $3::uuid
    ORDER BY event_id DESC
    LIMIT $4
),
found AS (
    SELECT event_id, seq FROM lo WHERE aggregate_id = $1::uuid
    UNION
    SELECT event_id, seq FROM hi WHERE aggregate_id = $1::uuid
),
batch_lo AS MATERIALIZED (
    SELECT first_seq, created_at FROM /*schema*/outbox_batches
    WHERE created_at >= $5::timestamptz AND created_at <= $6::timestamptz
    ORDER BY created_at
    LIMIT $7
),
batch_hi AS MATERIALIZED (
    SELECT first_seq, created_at FROM /*schema*/outbox_batches
    WHERE created_at >= $5::timestamptz AND created_at <= $6::timestamptz
    ORDER BY created_at DESC
    LIMIT $7
),
batch_found AS (
    SELECT (e ->> 'id')::uuid AS event_id, e ->> 'type' AS event_type, e ->> 'topic' AS topic,
        b.created_at, b.published_at, b.attempts, '' AS last_error, (e ->> 'seq')::bigint AS seq
    FROM /*schema*/outbox_batches AS b
    CROSS JOIN json_array_elements(b.events) AS e
    WHERE b.first_seq IN (SELECT first_seq FROM batch_lo UNION SELECT first_seq FROM batch_hi)
        AND e ->> 'aggregate' = $1::text
        AND (e ->> 'seq')::bigint <> ALL (b.split)
),
gap AS (
    -- (no max(uuid) before PostgreSQL 16)
    SELECT (SELECT count(*) FROM lo) >= $4
        AND (SELECT event_id FROM lo ORDER BY event_id DESC LIMIT 1) < (SELECT event_id FROM hi ORDER BY event_id LIMIT 1)
        OR (SELECT count(*) FROM batch_lo) >= $7
        AND (SELECT max(created_at) FROM batch_lo) < (SELECT min(created_at) FROM batch_hi) AS gap
)
SELECT gap.gap, e.event_id, e.event_type, e.topic, e.created_at, e.published_at, e.attempts, e.last_error
FROM gap
LEFT JOIN LATERAL (
    SELECT event_id, event_type, topic, created_at, published_at, attempts, last_error
    FROM (
        SELECT o.event_id, o.event_type, o.topic, o.created_at, o.published_at, o.attempts,
            coalesce(o.last_error, '') AS last_error, f.seq
        FROM found AS f
        JOIN /*schema*/outbox AS o ON o.event_id = f.event_id
        UNION ALL
        SELECT event_id, event_type, topic, created_at, published_at, attempts, last_error, seq
        FROM batch_found
    ) AS all_found
    ORDER BY seq
    LIMIT 100
) AS e ON true;

-- name: ReplayAncestors
-- The jobs a job was replayed from, nearest first: a primary-key probe per
-- step, at most 20 steps, never across tenants.
WITH RECURSIVE up AS (
    SELECT j.replay_of AS id, 1 AS depth
    FROM /*schema*/jobs AS j
    WHERE j.id = $1::uuid AND j.tenant = $2::text
    UNION ALL
    SELECT j.replay_of, up.depth + 1
    FROM up
    JOIN /*schema*/jobs AS j ON j.id = up.id AND j.tenant = $2::text
    WHERE up.depth < 20
)
SELECT /*summary_columns j*/
FROM up
JOIN /*schema*/jobs AS j ON j.id = up.id AND j.tenant = $2::text
ORDER BY up.depth;

-- name: ReplayChildren
-- The jobs replayed from a job, oldest first, through jobs_replay_of_idx
-- (replay_of; partial on replays).
SELECT /*summary_columns j*/
FROM /*schema*/jobs AS j
WHERE j.replay_of = $1::uuid AND j.tenant = $2::text
ORDER BY j.id
LIMIT 50;

-- name: ReplayedOf
-- Which of the listed jobs ($1, a page of ids) a replay points to, through
-- jobs_replay_of_idx (replay_of; partial on replays): one probe per id.
-- $2 narrows it to one tenant's replays ('' for every tenant's).
SELECT DISTINCT j.replay_of
FROM /*schema*/jobs AS j
WHERE j.replay_of = ANY ($1::uuid[])
    AND ($2::text = '' OR j.tenant = $2::text);

-- name: TerminalCount
-- The jobs in the terminal state $1 among the latest $3 entries of
-- jobs_finished_idx (state, finished_at), read backwards: the tabs' counts
-- of the dead-letter page. The first column counts tenant $2's ('' for
-- every tenant: then $3 is the count cap); the second how many entries were
-- read, to tell a count stopped at the window.
SELECT count(*) FILTER (WHERE $2::text = '' OR f.tenant = $2::text), count(*)
FROM (
    SELECT j.tenant FROM /*schema*/jobs AS j
    WHERE j.state = $1::text AND j.finished_at IS NOT NULL
    ORDER BY j.finished_at DESC
    LIMIT $3
) AS f;

-- name: UsageByDay
-- The usage ledger per tenant and UTC day from $2 to $3, for a page of $4
-- tenants after $1 in name order. The ledger's key is (tenant, day, pool,
-- shard): a loose index scan finds each next tenant with one probe, and
-- each tenant's days are a range of that key, so a page reads its tenants'
-- rows only, however many tenants the ledger holds.
WITH RECURSIVE t AS (
    (SELECT tenant FROM /*schema*/admission_usage WHERE tenant > $1::text ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT u.tenant FROM /*schema*/admission_usage AS u
            WHERE u.tenant > t.tenant ORDER BY u.tenant LIMIT 1)
    FROM t
    WHERE t.tenant IS NOT NULL
),
tenants AS (SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT $4)
SELECT t.tenant, u.day, sum(u.attempts)::bigint, sum(u.uncertain_attempts)::bigint,
    sum(u.input_tokens)::bigint, sum(u.output_tokens)::bigint, sum(u.cost)::bigint, sum(u.batch_cost)::bigint
FROM tenants AS t
JOIN /*schema*/admission_usage AS u ON u.tenant = t.tenant AND u.day >= $2::date AND u.day <= $3::date
GROUP BY t.tenant, u.day
ORDER BY t.tenant, u.day;

-- name: UsageByDayTenant
-- UsageByDay for one tenant ($1): a range of the ledger's key.
SELECT u.tenant, u.day, sum(u.attempts)::bigint, sum(u.uncertain_attempts)::bigint,
    sum(u.input_tokens)::bigint, sum(u.output_tokens)::bigint, sum(u.cost)::bigint, sum(u.batch_cost)::bigint
FROM /*schema*/admission_usage AS u
WHERE u.tenant = $1::text AND u.day >= $2::date AND u.day <= $3::date
GROUP BY u.tenant, u.day
ORDER BY u.day;

-- name: ReuseInvalidations
-- Operators' invalidations of result reuse (jobs.InvalidateReuse,
-- migration 0025), newest first: of kind $1 unless it is '', and for a
-- tenant-scoped console ($2 not '') those of its tenant and those of
-- every tenant (tenant NULL), never another tenant's. jobs'
-- ReuseInvalidations has no tenant filter, hence this statement. The
-- table holds one row per operator action and retention prunes a row
-- once no result it covers can be reused (at most jobs.MaxReuseTTL), so
-- it is small whatever the jobs: it is read and sorted for the LIMIT $3.
SELECT v.id, v.kind, v.reuse_key, v.tenant, v.invalidated_at, v.invalidated_by, v.reason
FROM /*schema*/job_reuse_invalidations AS v
WHERE ($1::text = '' OR v.kind = $1::text)
    AND ($2::text = '' OR v.tenant IS NULL OR v.tenant = $2::text)
ORDER BY v.invalidated_at DESC, v.id DESC
LIMIT $3;

-- name: ReuseInvalidation
-- One invalidation by its id $1 (the primary key), under the same tenant
-- rule as ReuseInvalidations: the one an action just recorded, for the
-- page it returns to.
SELECT v.id, v.kind, v.reuse_key, v.tenant, v.invalidated_at, v.invalidated_by, v.reason
FROM /*schema*/job_reuse_invalidations AS v
WHERE v.id = $1::bigint
    AND ($2::text = '' OR v.tenant IS NULL OR v.tenant = $2::text);
