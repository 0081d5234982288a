-- Queries of result reuse (jobs.Reuse; migration 0025). The claim's probe
-- for a result to reuse and its coalescing are in queries.sql (ClaimJobs'
-- claim_jobs block).

-- name: InvalidateReuse
-- Records an invalidation: no result of kind $1, of key $2 (every key when
-- NULL), computed by a job of tenant $3 (every tenant's when NULL), whose
-- attempt started by now, is reused again. One row whatever it covers: no
-- job row is changed or locked. Returns the row and how many results it
-- covers that finished within $6 ms (the longest TTL): an operator's
-- count, which reads the computed results of the kind.
WITH inv AS (
    INSERT INTO /*schema*/job_reuse_invalidations (kind, reuse_key, tenant, invalidated_by, reason)
    VALUES ($1, $2::text, $3::text, $4, $5)
    RETURNING id, kind, reuse_key, tenant, invalidated_at, invalidated_by, reason
)
SELECT inv.id, inv.kind, inv.reuse_key, inv.tenant, inv.invalidated_at, inv.invalidated_by, inv.reason,
    (SELECT count(*)
     FROM /*schema*/jobs AS s
     WHERE s.state = 'SUCCEEDED' AND s.reuse_key IS NOT NULL AND s.reused_from IS NULL
        AND s.kind = $1
        AND ($2::text IS NULL OR s.reuse_key = $2::text)
        AND ($3::text IS NULL OR s.tenant = $3::text)
        AND s.finished_at >= now() - $6::bigint * interval '1 millisecond') AS covered
FROM inv;

-- name: ListReuseInvalidations
-- The newest invalidations first, of kind $1 when it is not NULL
-- (job_reuse_invalidations_kind_idx); the table holds a row per operator
-- action, pruned with the results it covers.
SELECT id, kind, reuse_key, tenant, invalidated_at, invalidated_by, reason
FROM /*schema*/job_reuse_invalidations
WHERE $1::text IS NULL OR kind = $1::text
ORDER BY invalidated_at DESC, id DESC
LIMIT $2;
