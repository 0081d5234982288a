-- Fair claiming: weighted fair sharing between tenants, per-tenant caps on
-- running jobs, and at most one running job per group key.

-- One row per (queue, tenant) that has had work in the queue. vtime is the
-- tenant's virtual time in the queue: each claim adds jobs/weight, and a
-- claim serves the tenants with the lowest vtime first, so backlogged
-- tenants receive claims in proportion to their weights. A tenant whose
-- claim came up short (nothing it could run) is marked idle and leaves the
-- claim's scan; work arriving for it makes it active again with its vtime
-- raised to the queue's lowest active vtime, so idleness banks no credit.
--
-- The row is also the tenant's claim lock: a claim holds it FOR UPDATE from
-- choosing the tenant to its commit, so the running-job count and the group
-- check it makes for that tenant cannot race another runner's claim.
CREATE TABLE /*schema*/tenant_queues (
    queue      text             NOT NULL,
    tenant     text             NOT NULL,
    vtime      double precision NOT NULL DEFAULT 0,
    idle       boolean          NOT NULL DEFAULT false,
    updated_at timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, tenant)
);

-- The claim's tenant scan: active tenants of a queue in vtime order. Partial
-- on active rows, so idle tenants (however many) cost the scan nothing.
CREATE INDEX tenant_queues_vtime_idx ON /*schema*/tenant_queues (queue, vtime, tenant)
    WHERE NOT idle;

-- The sweeps that bring idle tenants back: all of a queue's idle tenants,
-- or those marked idle in the last seconds (updated_at is when a claim
-- marked it idle: an idle row is not written again until it wakes).
CREATE INDEX tenant_queues_idle_idx ON /*schema*/tenant_queues (queue, updated_at)
    WHERE idle;

-- Weights and caps, as data: a change applies to the next claim. The row
-- whose tenant is '' (never a valid tenant name) holds the defaults for
-- tenants without a row of their own. max_running 0 means no cap.
CREATE TABLE /*schema*/tenant_limits (
    tenant      text        PRIMARY KEY,
    weight      integer     NOT NULL DEFAULT 1,
    max_running integer     NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenant_limits_weight_check CHECK (weight BETWEEN 1 AND 1000),
    CONSTRAINT tenant_limits_max_running_check CHECK (max_running >= 0)
);
INSERT INTO /*schema*/tenant_limits (tenant, weight, max_running) VALUES ('', 1, 0);

-- The claim path is per tenant now: a tenant's most urgent, longest-waiting
-- eligible jobs of a queue. Replaces jobs_claim_idx.
CREATE INDEX jobs_tenant_claim_idx ON /*schema*/jobs (queue, tenant, priority, available_at, id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');
DROP INDEX /*schema*/jobs_claim_idx;

-- Running jobs per (queue, tenant): the cap check counts them, reading only
-- that tenant's running jobs.
CREATE INDEX jobs_running_tenant_idx ON /*schema*/jobs (queue, tenant)
    WHERE state = 'RUNNING';

-- Group order: a grouped job may start only when no earlier job of its
-- group is still waiting or running. Partial on grouped, unfinished jobs.
CREATE INDEX jobs_group_idx ON /*schema*/jobs (tenant, group_key, id)
    WHERE group_key IS NOT NULL AND state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

-- A backstop for the claim's group check: two running jobs of one group
-- cannot both commit.
CREATE UNIQUE INDEX jobs_group_running_idx ON /*schema*/jobs (tenant, group_key)
    WHERE group_key IS NOT NULL AND state = 'RUNNING';

-- Tenants with work waiting when this migration runs.
INSERT INTO /*schema*/tenant_queues (queue, tenant)
SELECT DISTINCT queue, tenant
FROM /*schema*/jobs
WHERE state IN ('READY', 'RETRY_SCHEDULED');

-- The virtual time a tenant becoming active starts from: the lowest of the
-- queue's active tenants (their "now"), so a tenant that was idle cannot
-- bank credit and starve the others when it returns. NULL when none is
-- active. Reads one entry of tenant_queues_vtime_idx.
CREATE FUNCTION /*schema*/active_vtime_floor(q text) RETURNS double precision
    LANGUAGE sql STABLE
    AS $$ SELECT min(vtime) FROM /*schema*/tenant_queues WHERE queue = q AND NOT idle $$;
