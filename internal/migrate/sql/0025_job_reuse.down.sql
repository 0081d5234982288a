DROP TABLE /*schema*/job_reuse_invalidations;
DROP INDEX /*schema*/jobs_reuse_idx;
ALTER TABLE /*schema*/job_attempts DROP COLUMN reused_from;
ALTER TABLE /*schema*/jobs
    DROP COLUMN reused_from,
    DROP COLUMN reuse_ttl_ms,
    DROP COLUMN reuse_shared,
    DROP COLUMN reuse_key;
