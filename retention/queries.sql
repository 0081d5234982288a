-- The retention service's lease (migration 0012: one row). See service.go.

-- name: AcquireLease
-- Takes the lease for $1 for $2 ms when it is free, lapsed, or already
-- $1's. SKIP LOCKED: while the holder's batch holds the row (its fence,
-- below) the lease is plainly taken, and a contender returns at once
-- instead of waiting for that batch. acquired_at is kept across renewals.
-- $3 is the holder's policy, recorded for operators; NULL (a one-off pass,
-- llmq prune) keeps the one recorded.
UPDATE /*schema*/retention_lease AS l SET
    holder = $1,
    lease_until = now() + $2 * interval '1 millisecond',
    acquired_at = CASE WHEN l.holder = $1 AND l.lease_until > now() THEN l.acquired_at ELSE now() END,
    policy = coalesce($3::jsonb, l.policy)
WHERE l.id IN (SELECT id FROM /*schema*/retention_lease FOR UPDATE SKIP LOCKED)
    AND (l.holder IS NULL OR l.holder = $1 OR l.lease_until < now())
RETURNING true;

-- name: FenceBatch
-- The first statement of every pruning batch's transaction: renews $1's
-- lease for $2 ms if $1 still holds it. The row lock it takes is held
-- until the batch commits, so a contender cannot take the lease over while
-- a batch runs (AcquireLease skips the locked row), and a holder that lost
-- the lease (paused past it) deletes nothing: no row, no batch.
UPDATE /*schema*/retention_lease SET
    lease_until = now() + $2 * interval '1 millisecond'
WHERE holder = $1 AND lease_until > now()
RETURNING true;

-- name: RecordPass
-- What $1's last pass deleted, for operators; only while $1 holds the
-- lease.
UPDATE /*schema*/retention_lease SET
    last_pass_at = now(),
    last_pass = $2
WHERE holder = $1;

-- name: ReleaseLease
-- Frees the lease at shutdown, so another process takes over at its next
-- check instead of waiting for the lease to lapse.
UPDATE /*schema*/retention_lease SET
    holder = NULL,
    lease_until = '-infinity'
WHERE holder = $1;

-- name: ReadLease
-- The lease as operators see it, judged by the database's clock (the one
-- every holder renews by), which is returned too: a reader's own clock
-- may be off.
SELECT coalesce(holder, ''), nullif(lease_until, '-infinity'), holder IS NOT NULL AND lease_until > now(),
    acquired_at, policy, last_pass_at, last_pass, now()
FROM /*schema*/retention_lease;
