-- Retention of admission permits (see prune.go). Expired permits are
-- reaped with ReapPermits (queries.sql), the statement every grant cycle
-- runs, pool by pool: it deletes the pool's expired permits and hands
-- their slots back in one statement. The usage ledger (admission_usage)
-- is never pruned: it is what tenants are billed from.

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
