CREATE INDEX jobs_tenant_id_idx ON /*schema*/jobs (tenant, id DESC);
ALTER TABLE /*schema*/jobs ADD CONSTRAINT jobs_tenant_idempotency_key_key UNIQUE (tenant, idempotency_key);
DROP TABLE /*schema*/job_keys;
