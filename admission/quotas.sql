-- Queries of tenant acceptance quotas. They run inside the enqueue
-- transaction (jobs.Config.OnAccept), after the new jobs are inserted.

-- name: UpsertTenantQuota
INSERT INTO /*schema*/admission_tenant_quotas AS q (
    tenant, max_pending_jobs, max_pending_bytes, max_pending_tokens, max_daily_cost)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant) DO UPDATE SET
    max_pending_jobs = excluded.max_pending_jobs,
    max_pending_bytes = excluded.max_pending_bytes,
    max_pending_tokens = excluded.max_pending_tokens,
    max_daily_cost = excluded.max_daily_cost,
    updated_at = now();

-- name: LockTenantQuota
-- Serialises acceptances of one tenant until the enqueue transaction ends:
-- a transaction-scoped advisory lock keyed by schema and tenant (a hash
-- collision only serialises two tenants needlessly). It works for tenants
-- without a quota row, and holds no row lock that could block
-- SetTenantQuota. The tenant's own quota row, if any, comes back with it
-- (LEFT JOIN: the lock side always yields its row, so the lock is always
-- taken). The lock is held until the caller's transaction ends, so keep
-- enqueue transactions short.
SELECT q.tenant IS NOT NULL, q.max_pending_jobs, q.max_pending_bytes, q.max_pending_tokens, q.max_daily_cost
FROM (SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))) AS lock
LEFT JOIN /*schema*/admission_tenant_quotas AS q ON q.tenant = $2;

-- name: CountPendingTenant
-- The tenant's pending (waiting or running) jobs (including those just
-- inserted), their payload bytes and estimated tokens, reading at most $2
-- jobs (the job quota + 1; -1 for no limit); and today's spend from the
-- usage ledger. The waiting jobs are read through jobs_tenant_claim_idx and
-- the running ones through jobs_running_tenant_idx, both leading with the
-- tenant: each branch's state test is exactly its index's predicate.
SELECT count(*), coalesce(sum(octet_length(p.payload::text)), 0)::bigint, coalesce(sum(p.estimated_tokens), 0)::bigint,
    (SELECT coalesce(sum(cost), 0)::bigint FROM /*schema*/admission_usage
     WHERE tenant = $1 AND day = (now() AT TIME ZONE 'UTC')::date)
FROM (
    SELECT payload, estimated_tokens
    FROM /*schema*/jobs
    WHERE tenant = $1 AND state IN ('READY', 'RETRY_SCHEDULED')
    UNION ALL
    SELECT payload, estimated_tokens
    FROM /*schema*/jobs
    WHERE tenant = $1 AND state = 'RUNNING'
    LIMIT CASE WHEN $2::bigint < 0 THEN NULL ELSE $2::bigint END
) AS p;

-- name: CountPendingSystem
-- Pending jobs of every tenant, counting at most $1 (the bound + 1),
-- through the same two indexes.
SELECT count(*) FROM (
    SELECT 1 FROM /*schema*/jobs
    WHERE state IN ('READY', 'RETRY_SCHEDULED')
    UNION ALL
    SELECT 1 FROM /*schema*/jobs
    WHERE state = 'RUNNING'
    LIMIT $1
) AS p;

-- name: SelectTenantQuotas
-- For operators, not on the enqueue path.
-- Every tenant's own quota, or only $1's when $1 is not NULL. NULL columns
-- are no limit.
SELECT tenant, max_pending_jobs, max_pending_bytes, max_pending_tokens, max_daily_cost
FROM /*schema*/admission_tenant_quotas
WHERE $1::text IS NULL OR tenant = $1
ORDER BY tenant;

-- name: DeleteTenantQuota
DELETE FROM /*schema*/admission_tenant_quotas WHERE tenant = $1;
