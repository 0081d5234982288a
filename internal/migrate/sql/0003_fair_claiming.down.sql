DROP FUNCTION /*schema*/active_vtime_floor(text);
CREATE INDEX jobs_claim_idx ON /*schema*/jobs (queue, priority, available_at, id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');
DROP INDEX /*schema*/jobs_group_running_idx;
DROP INDEX /*schema*/jobs_group_idx;
DROP INDEX /*schema*/jobs_running_tenant_idx;
DROP INDEX /*schema*/jobs_tenant_claim_idx;
DROP TABLE /*schema*/tenant_limits;
DROP TABLE /*schema*/tenant_queues;
