-- Retention of admission permits (see prune.go). A pool with acquirers
-- reaps its own expired permits in its grant cycles (GrantGroup, when
-- slots are short); an idle pool's wait for Pruner.ReapExpired, which
-- reaps them pool by pool with ReapPermits (queries.sql), or for
-- ReapExpiredBatch below, a batch at a time. Each deletes a pool's expired
-- permits and hands their slots back in one statement. The usage ledger
-- (admission_usage) is never pruned: it is what tenants are billed from.

-- name: PoolsWithExpiredPermits
-- Pools holding at least one expired permit: a scan of admission_pools (a
-- row per configured pool) with one probe of admission_permits_expiry_idx
-- (pool, expires_at) each.
SELECT p.name
FROM /*schema*/admission_pools AS p
WHERE EXISTS (
    SELECT FROM /*schema*/admission_permits AS a
    WHERE a.pool = p.name AND a.expires_at <= now())
ORDER BY p.name;

-- name: CountExpiredPermits
-- Expired permits of every pool, and the oldest permit's acquisition time
-- (NULL when none). admission_permits holds granted, unreleased permits
-- only: a few per in-flight call, so a scan is cheap.
SELECT count(*) FILTER (WHERE expires_at <= now()), min(acquired_at)
FROM /*schema*/admission_permits;

-- name: ReapExpiredBatch
-- One batch of the maintenance service's reaping: the first pool, by name,
-- after $2 that holds expired permits, and up to $1 of its expired
-- permits deleted with their slots (and in-flight tokens) handed back: one pool's row locked per
-- transaction, never every pool's at once. Returns the pool's name (NULL
-- when no pool after $2 holds expired permits) and how many permits were
-- reaped. Lock order as a release's: the permits first (SKIP LOCKED: a
-- permit whose release or grant cycle is deleting it is left to that),
-- then the pool row, which a grant cycle holds while it reaps with SKIP
-- LOCKED too, so neither waits on the other for long and neither
-- deadlocks. Served by admission_permits_expiry_idx (pool, expires_at),
-- then the primary key, probed with the batch's ids as an array (a
-- semi-join with them can be planned as a scan of the whole table).
WITH target AS (
    SELECT p.name
    FROM /*schema*/admission_pools AS p
    WHERE p.name > $2 AND EXISTS (
        SELECT FROM /*schema*/admission_permits AS a
        WHERE a.pool = p.name AND a.expires_at <= now())
    ORDER BY p.name
    LIMIT 1
),
gone AS (
    DELETE FROM /*schema*/admission_permits AS x
    WHERE x.id = ANY (ARRAY(
        SELECT e.id FROM /*schema*/admission_permits AS e
        WHERE e.pool = (SELECT name FROM target) AND e.expires_at <= now()
        ORDER BY e.expires_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED))
    RETURNING x.tokens
),
handed AS (
    UPDATE /*schema*/admission_pools AS p SET
        in_flight = p.in_flight - (SELECT count(*) FROM gone),
        in_flight_tokens = greatest(0, p.in_flight_tokens - (SELECT sum(tokens) FROM gone))
    WHERE p.name = (SELECT name FROM target) AND EXISTS (SELECT 1 FROM gone)
    RETURNING 1
)
SELECT (SELECT name FROM target), (SELECT count(*) FROM gone), (SELECT count(*) FROM handed);
