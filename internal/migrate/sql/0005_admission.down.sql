DROP TABLE /*schema*/admission_usage;
DROP INDEX /*schema*/jobs_pending_tenant_idx;
DROP TABLE /*schema*/admission_tenant_quotas;
DROP TABLE /*schema*/admission_permits;
DROP FUNCTION /*schema*/admission_level(double precision, double precision, double precision, timestamptz);
DROP TABLE /*schema*/admission_pools;
