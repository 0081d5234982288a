-- The observer lease (migration 0018): one row per pool, taken by the
-- observer that applies the control law. Lease statements touch only this
-- table, never admission_pools, whose row lock the grant cycles wait for.

-- name: TakeLease
-- $1 pool, $2 holder, $3 lease in milliseconds.
-- Takes the pool's lease for $2 when nobody holds it or it lapsed, or
-- renews it when $2 holds it; returns when it lasts until, or no row while
-- another observer holds it. Two observers taking a free lease at once
-- both reach the INSERT; one inserts and the other, waiting on the primary
-- key, re-checks the DO UPDATE's WHERE against the committed row and takes
-- nothing. acquired_at says since when the holder has held it.
INSERT INTO /*schema*/admission_observer_leases AS l (pool, holder, lease_until)
VALUES ($1, $2, now() + $3 * interval '1 millisecond')
ON CONFLICT (pool) DO UPDATE SET
    holder = EXCLUDED.holder,
    lease_until = EXCLUDED.lease_until,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.lease_until > now() THEN l.acquired_at ELSE now() END
WHERE l.holder = EXCLUDED.holder OR l.lease_until < now()
RETURNING l.lease_until;

-- name: ReleaseLease
-- $1 pool, $2 holder. Frees the lease when an observer stops, so another
-- takes over at its next reading instead of when the lease lapses.
DELETE FROM /*schema*/admission_observer_leases WHERE pool = $1 AND holder = $2;
