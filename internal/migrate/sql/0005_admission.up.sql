-- Admission: provider pools (the scope that shares a quota: a provider
-- project or model deployment, never a pod), the permits held against
-- them, and per-tenant usage.

-- One row per pool holding every dimension: the request bucket (RPM), the
-- token bucket (TPM), in-flight permits and the cooldown. Keeping them in
-- one row lets a single UPDATE check and take all of them at once under the
-- row lock; see admission/queries.sql for why that is race-free.
--
-- Buckets are stored lazily: *_level is what the bucket held at
-- refilled_at; the current level is least(burst, level + rate·elapsed),
-- computed by admission_level. A level may be negative when a provider
-- reported more usage than was reserved: the debt delays later grants.
CREATE TABLE /*schema*/admission_pools (
    name             text             PRIMARY KEY,
    rpm              integer          NOT NULL CHECK (rpm > 0),
    tpm              bigint           NOT NULL CHECK (tpm > 0),
    max_in_flight    integer          NOT NULL CHECK (max_in_flight > 0),
    request_burst    integer          NOT NULL CHECK (request_burst > 0),
    token_burst      bigint           NOT NULL CHECK (token_burst > 0),
    -- Refund policy on release (see admission.Pool).
    charge_reserved  boolean          NOT NULL DEFAULT false,
    -- Prices in micro-units per million tokens, for the usage ledger.
    input_price      bigint           NOT NULL DEFAULT 0 CHECK (input_price >= 0),
    output_price     bigint           NOT NULL DEFAULT 0 CHECK (output_price >= 0),
    refund_uncertain boolean          NOT NULL DEFAULT false,
    request_level    double precision NOT NULL,
    token_level      double precision NOT NULL,
    refilled_at      timestamptz      NOT NULL DEFAULT now(),
    in_flight        integer          NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    cooldown_until   timestamptz      NOT NULL DEFAULT '-infinity',
    updated_at       timestamptz      NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
-- fillfactor 50: a hot pool's row is updated thousands of times a second.
-- No indexed column changes on acquire or release, so with free space on
-- the page every update is HOT and the primary key index is never touched.

-- The current level of a lazily refilled bucket. An inlinable SQL function
-- so the acquire statement states the formula once per dimension. The
-- elapsed time is never negative: a statement whose now() (its transaction
-- start) is older than a concurrent writer's refilled_at simply gets no
-- refill, which can only under-admit.
CREATE FUNCTION /*schema*/admission_level(
    level double precision, burst double precision, per_minute double precision, since timestamptz)
RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT least(burst, level + per_minute / 60.0 * greatest(0, extract(epoch FROM now() - since)::double precision)) $$;

-- A granted, unreleased permit. The pool row's in_flight counts these rows;
-- a holder that dies never releases, so each permit expires and the reaper
-- (DELETE ... RETURNING, then one decrement) hands its slot back. No
-- foreign key to the pool: the check would cost a lookup on every grant,
-- and a permit of a pool that no longer exists is inert.
CREATE TABLE /*schema*/admission_permits (
    id          uuid        PRIMARY KEY,
    pool        text        NOT NULL,
    tenant      text        NOT NULL DEFAULT '',
    tokens      bigint      NOT NULL,
    holder      text        NOT NULL DEFAULT '',
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- The reaper looks only for a pool's expired permits.
CREATE INDEX admission_permits_expiry_idx ON /*schema*/admission_permits (pool, expires_at);

-- Tenant acceptance quotas; a tenant without a row gets the host's
-- configured default. NULL means no limit on that dimension.
CREATE TABLE /*schema*/admission_tenant_quotas (
    tenant              text        PRIMARY KEY,
    max_pending_jobs    bigint      CHECK (max_pending_jobs > 0),
    max_pending_bytes   bigint      CHECK (max_pending_bytes > 0),
    max_pending_tokens  bigint      CHECK (max_pending_tokens > 0),
    max_daily_cost      bigint      CHECK (max_daily_cost > 0),      -- micro-units of the pools' currency
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- A tenant's pending (not yet finished) jobs, for the quota check at
-- acceptance. The check reads at most the quota's worth of entries (LIMIT),
-- so its cost is bounded by the quota, not by the tenant's history.
CREATE INDEX jobs_pending_tenant_idx ON /*schema*/jobs (tenant) INCLUDE (estimated_tokens)
    WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

-- Usage ledger: what providers reported, per tenant, pool and UTC day,
-- written when a permit is released (never from reservations). Each key
-- is spread over a few shard rows, picked at random per release, so a busy
-- tenant's releases do not queue on one row lock the way a hot pool's do;
-- readers sum the shards.
CREATE TABLE /*schema*/admission_usage (
    tenant             text   NOT NULL,
    pool               text   NOT NULL,
    day                date   NOT NULL,
    shard              smallint NOT NULL,
    attempts           bigint NOT NULL DEFAULT 0,
    uncertain_attempts bigint NOT NULL DEFAULT 0,
    input_tokens       bigint NOT NULL DEFAULT 0,
    output_tokens      bigint NOT NULL DEFAULT 0,
    cost               bigint NOT NULL DEFAULT 0,   -- micro-units
    PRIMARY KEY (tenant, day, pool, shard)
);
