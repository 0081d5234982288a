-- The chaos run's own table and the reads its checks make of llmq's, the
-- invoice example's and the ERP's tables. Every read is of a finished or
-- settling run; none takes locks.

-- name: CreateSignals
-- One row per job event the signal path's inbox accepted: handled counts how
-- often the handler's transaction committed for it, which the inbox must
-- keep at one however often the broker redelivers.
CREATE TABLE IF NOT EXISTS /*schema*/chaos_signals (
    event_id text    PRIMARY KEY,
    handled  integer NOT NULL
);

-- name: RecordSignal
INSERT INTO /*schema*/chaos_signals AS s (event_id, handled) VALUES ($1, 1)
ON CONFLICT (event_id) DO UPDATE SET handled = s.handled + 1;

-- name: Progress
SELECT state, count(*) FROM /*schema*/jobs WHERE kind = $1 GROUP BY state;

-- name: SucceededResults
SELECT id, md5(result::text) FROM /*schema*/jobs WHERE kind = $1 AND state = 'SUCCEEDED';

-- name: ExpireLeases
-- What a supervisor that saw a worker process die may do: its leases are
-- ended now instead of when they run out, so the reaper takes the jobs back
-- at once. The fence is left to the reaper. Run once the dead process's
-- backends are gone, so no transaction of its holds a row.
UPDATE /*schema*/jobs SET lease_until = now() WHERE state = 'RUNNING' AND lease_owner = $1;

-- name: ExpireLeasesSkipLocked
-- The same for a paused worker, which may hold a row in an open
-- transaction: waiting for it would wait for the pause, so such a job
-- keeps its lease.
UPDATE /*schema*/jobs SET lease_until = now()
WHERE id IN (SELECT id FROM /*schema*/jobs WHERE state = 'RUNNING' AND lease_owner = $1 FOR UPDATE SKIP LOCKED);

-- name: Backends
-- The backends of one child process (application_name $1).
SELECT count(*) FROM pg_stat_activity WHERE application_name = $1;

-- name: JobByKey
SELECT j.state, CASE WHEN j.state = 'RUNNING' THEN j.lease_owner ELSE '' END
FROM /*schema*/job_keys AS k
JOIN /*schema*/jobs AS j ON j.id = k.id
WHERE k.tenant = $1 AND k.idempotency_key = $2;

-- name: ExpirePermits
UPDATE /*schema*/admission_permits SET expires_at = now() WHERE holder = $1;

-- name: BackendsInTransaction
-- Backends of the run's child processes (application_name prefix $1) that
-- are inside a transaction right now.
SELECT pid, application_name FROM pg_stat_activity
WHERE application_name LIKE $1 || '%' AND xact_start IS NOT NULL AND pid <> pg_backend_pid();

-- name: Terminate
SELECT pg_terminate_backend($1);

-- name: Jobs
SELECT id, idempotency_key, state, attempt, fence, lease_owner, lease_until, available_at,
       finished_at IS NOT NULL, coalesce(md5(result::text), ''), coalesce(error_class, '')
FROM /*schema*/jobs WHERE kind = $1;

-- name: Attempts
SELECT a.job_id, a.attempt, a.fence, a.worker, a.outcome, a.uncertain, coalesce(a.error_class, ''),
       left(coalesce(a.error, ''), 300), coalesce(a.input_tokens, 0) + coalesce(a.output_tokens, 0),
       coalesce(a.model, ''), coalesce(a.moves, '[]')
FROM /*schema*/job_attempts a JOIN /*schema*/jobs j ON j.id = a.job_id
WHERE j.kind = $1 ORDER BY a.job_id, a.attempt;

-- name: Deliveries
-- Each extraction job's webhook delivery and the state of the job that
-- carries it to the ERP.
SELECT d.event_id, coalesce(w.state, '')
FROM /*schema*/webhook_deliveries d
LEFT JOIN /*schema*/jobs w ON w.kind = $1 AND w.payload->>'delivery_id' = d.id::text;

-- name: Receipts
SELECT job_id, count(*) FROM /*schema*/erp_receipts GROUP BY job_id;

-- name: Booked
SELECT job_id, count(*) FROM /*schema*/erp_invoices GROUP BY job_id;

-- name: Signals
-- Job events in the outbox, whether published, and how often the signal
-- path's handler committed each (0: never). The events are read from both
-- of the outbox's tables: single-event rows, and the events of batch rows
-- (the job store writes a statement's events as one when there are
-- several), an event split out of its row once, as its copy.
WITH job_events AS (
    SELECT event_id::text AS event_id, published_at IS NOT NULL AS published
    FROM /*schema*/outbox
    WHERE topic = $1
    UNION ALL
    SELECT e ->> 'id', b.published_at IS NOT NULL
    FROM /*schema*/outbox_batches AS b
    CROSS JOIN json_array_elements(b.events) AS e
    WHERE e ->> 'topic' = $1
        AND (e ->> 'seq')::bigint <> ALL (b.split)
)
SELECT o.event_id, o.published, coalesce(s.handled, 0)
FROM job_events o LEFT JOIN /*schema*/chaos_signals s ON s.event_id = o.event_id;

-- name: Unfinished
-- Extraction and delivery jobs not finished yet (see awaitSettled, which
-- reads the job events through Signals).
SELECT count(*) FROM /*schema*/jobs WHERE finished_at IS NULL;

-- name: LedgerTokens
-- The tokens the usage ledger holds for the provider's pools (the
-- route's primary and fallback, each call under its own): what the
-- workers' permits were released with. A scan of a small table at the end
-- of a run, summing its shard rows.
SELECT coalesce(sum(input_tokens + output_tokens), 0)::bigint FROM /*schema*/admission_usage WHERE pool = ANY($1);
