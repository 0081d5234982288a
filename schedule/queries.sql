-- Statements of package schedule. The schedules table holds a handful of
-- rows (one per schedule); every statement on it is by primary key, or a
-- scan of the partial index schedules_due. schedule_lease is one row.

-- fragment: schedule_columns
name, cron, every_ms, time_zone, jitter_ms, misfire, catch_up_max,
tenant, kind, queue, priority, payload, group_key, max_attempts, estimated_tokens,
paused, next_slot, last_slot, last_job, last_enqueued_at, source, created_at, updated_at

-- name: PutSchedule
-- Inserts schedule $1, or replaces its spec, for source $17 ('code' from a
-- scheduler's start, 'operator' from Store.Put). paused and the progress
-- are kept; next_slot is replaced by $16 (the first slot after now) only
-- when the timing (cron, every, zone) changed, so that a restart with the
-- same spec neither skips nor repeats a slot. An operator's put does not
-- replace a code schedule (no row returned: ErrCodeOwned); a code
-- schedule replaces an operator's of its name. One row lock, the
-- conflicting row's, held to the end of the caller's transaction.
INSERT INTO /*schema*/schedules AS s (name, cron, every_ms, time_zone, jitter_ms, misfire, catch_up_max,
    tenant, kind, queue, priority, payload, group_key, max_attempts, estimated_tokens, next_slot, source)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
ON CONFLICT (name) DO UPDATE SET
    cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, time_zone = EXCLUDED.time_zone,
    jitter_ms = EXCLUDED.jitter_ms, misfire = EXCLUDED.misfire, catch_up_max = EXCLUDED.catch_up_max,
    tenant = EXCLUDED.tenant, kind = EXCLUDED.kind, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
    payload = EXCLUDED.payload, group_key = EXCLUDED.group_key, max_attempts = EXCLUDED.max_attempts,
    estimated_tokens = EXCLUDED.estimated_tokens, source = EXCLUDED.source,
    next_slot = CASE
        WHEN (s.cron, s.every_ms, s.time_zone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_ms, EXCLUDED.time_zone)
        THEN EXCLUDED.next_slot ELSE s.next_slot END,
    updated_at = now()
WHERE EXCLUDED.source = 'code' OR s.source = 'operator'
RETURNING name;

-- name: DeleteSchedule
DELETE FROM /*schema*/schedules WHERE name = $1 RETURNING name;

-- name: PauseSchedule
UPDATE /*schema*/schedules SET paused = true, updated_at = now() WHERE name = $1 RETURNING name;

-- name: LockForResume
-- Resume's read of the timing, locking the row so that the next_slot it
-- computes is written over what it read.
SELECT cron, every_ms, time_zone, jitter_ms, paused FROM /*schema*/schedules WHERE name = $1 FOR UPDATE;

-- name: ResumeSchedule
UPDATE /*schema*/schedules SET paused = false, next_slot = $2, updated_at = now() WHERE name = $1;

-- name: ListSchedules
-- Every schedule, by name; $1 NULL, or only the one named. A sequential
-- scan of a table of a few rows, or the primary key.
SELECT /*schedule_columns*/ FROM /*schema*/schedules
WHERE $1::text IS NULL OR name = $1
ORDER BY name;

-- name: DueSchedules
-- The active scheduler's tick: the unpaused schedules whose next slot has
-- come by $1 (the scheduler's clock), of source 'operator' or named in $2
-- (the code schedules this scheduler knows; one a newer build registered
-- waits for a scheduler of that build). schedules_due, no lock: each is
-- locked and checked again by LockDue in its own transaction.
SELECT name FROM /*schema*/schedules
WHERE NOT paused AND next_slot <= $1 AND (source = 'operator' OR name = ANY ($2))
ORDER BY next_slot
LIMIT 1000;

-- name: HoldLease
-- The fence of a tick's transaction: the lease row, still naming scheduler
-- $1 with epoch $2 and not expired, locked FOR SHARE to the end of the
-- transaction, so that a takeover (AcquireLease's UPDATE) waits for the
-- transaction and then sees its writes, and a scheduler that lost the
-- lease finds no row and writes nothing.
SELECT epoch FROM /*schema*/schedule_lease
WHERE holder = $1 AND epoch = $2 AND lease_until > now()
FOR SHARE;

-- name: LockDue
-- One due schedule, locked FOR UPDATE (by primary key) for the tick's
-- transaction; no row when it was paused, deleted or advanced meanwhile.
SELECT cron, every_ms, time_zone, jitter_ms, misfire, catch_up_max,
    tenant, kind, queue, priority, payload, group_key, max_attempts, estimated_tokens, next_slot
FROM /*schema*/schedules
WHERE name = $1 AND NOT paused AND next_slot <= $2
FOR UPDATE;

-- name: AdvanceSchedule
-- After the tick enqueued slots up to $3 (NULL: none, every due slot was
-- skipped or refused), the next slot to wait for is $2.
UPDATE /*schema*/schedules SET
    next_slot = $2,
    last_slot = coalesce($3, last_slot),
    last_job = CASE WHEN $3::timestamptz IS NULL THEN last_job ELSE $4 END,
    last_enqueued_at = CASE WHEN $3::timestamptz IS NULL THEN last_enqueued_at ELSE $5 END
WHERE name = $1;

-- name: LeaseFree
-- A standby's check, as the outbox relay's: whether the lease is free,
-- and else in how many ms it expires unless renewed.
SELECT lease_until < now(),
    CASE WHEN lease_until > now() AND lease_until < 'infinity' THEN extract(epoch FROM lease_until - now()) * 1000 ELSE 0 END::float8
FROM /*schema*/schedule_lease;

-- name: AcquireLease
-- Takes the lease for scheduler $1, for $2 ms, if it is free, with the
-- next epoch; returns it and the previous holder. The row lock serialises
-- acquirers: the second finds lease_until in the future and no row.
WITH old AS (
    SELECT holder FROM /*schema*/schedule_lease FOR UPDATE
)
UPDATE /*schema*/schedule_lease AS l SET
    holder = $1,
    epoch = l.epoch + 1,
    lease_until = now() + $2 * interval '1 millisecond',
    acquired_at = now()
FROM old
WHERE l.lease_until < now()
RETURNING l.epoch, old.holder;

-- name: RenewLease
UPDATE /*schema*/schedule_lease SET lease_until = now() + $3 * interval '1 millisecond'
WHERE holder = $1 AND epoch = $2;

-- name: ReleaseLease
UPDATE /*schema*/schedule_lease SET lease_until = '-infinity'
WHERE holder = $1 AND epoch = $2;

-- name: ReadLease
SELECT holder, epoch, lease_until FROM /*schema*/schedule_lease;
