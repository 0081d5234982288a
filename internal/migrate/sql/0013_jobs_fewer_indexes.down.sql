DROP INDEX /*schema*/jobs_running_tenant_idx;
CREATE INDEX jobs_running_tenant_idx ON /*schema*/jobs (queue, tenant)
    WHERE state = 'RUNNING';

DROP INDEX /*schema*/jobs_tenant_claim_idx;
CREATE INDEX jobs_tenant_claim_idx ON /*schema*/jobs (queue, tenant, priority, available_at, id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');

CREATE INDEX jobs_pending_tenant_idx ON /*schema*/jobs (tenant) INCLUDE (estimated_tokens)
    WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

CREATE INDEX jobs_lease_expiry_idx ON /*schema*/jobs (lease_until)
    WHERE state = 'RUNNING';

ALTER TABLE /*schema*/jobs RESET (fillfactor);
