-- Jobs: one row per accepted unit of work. The row is the authority for the
-- job's state; brokers only carry signals about it.
CREATE TABLE /*schema*/jobs (
    id                  uuid        PRIMARY KEY,              -- UUIDv7: time-ordered, so the primary key index stays append-mostly
    tenant              text        NOT NULL,
    kind                text        NOT NULL,
    queue               text        NOT NULL,
    priority            smallint    NOT NULL DEFAULT 0,       -- 0 is the most urgent class
    idempotency_key     text,
    request_hash        text,
    payload             jsonb       NOT NULL,
    group_key           text,
    state               text        NOT NULL DEFAULT 'READY',
    attempt             integer     NOT NULL DEFAULT 0,       -- never reset: a restart continues the count
    max_attempts        integer     NOT NULL,
    fence               bigint      NOT NULL DEFAULT 0,       -- bumped on every claim and every lease revocation
    lease_owner         text,
    lease_until         timestamptz,
    attempted_at        timestamptz,                          -- when the current (or last) attempt was claimed
    available_at        timestamptz NOT NULL DEFAULT now(),
    deadline_at         timestamptz,
    state_version       bigint      NOT NULL DEFAULT 1,       -- bumped on every change a client can observe
    estimated_tokens    bigint      NOT NULL DEFAULT 0,
    result              jsonb,
    error_class         text,
    last_error          text,
    replay_of           uuid        REFERENCES /*schema*/jobs (id) ON DELETE SET NULL,
    replayed_by         text,                                 -- who asked for the replay, and why
    replay_reason       text,
    cancel_requested_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,

    CONSTRAINT jobs_state_check CHECK (state IN (
        'READY', 'RUNNING', 'RETRY_SCHEDULED',
        'SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')),
    CONSTRAINT jobs_attempts_check CHECK (max_attempts >= 1 AND attempt >= 0),
    CONSTRAINT jobs_lease_check CHECK (state <> 'RUNNING' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL)),
    CONSTRAINT jobs_finished_check CHECK (
        (state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')) = (finished_at IS NOT NULL)),
    -- Idempotent acceptance. NULL keys are distinct, so jobs enqueued without a
    -- key are never deduplicated. The constraint's index also serves lookups
    -- by (tenant, key) on the duplicate path.
    CONSTRAINT jobs_tenant_idempotency_key_key UNIQUE (tenant, idempotency_key)
);

-- The claim path: runners read the most urgent, longest-waiting eligible job
-- of a queue. Partial on the eligible states, so the index holds only the
-- runnable backlog and finished jobs cost it nothing however many there are.
CREATE INDEX jobs_claim_idx ON /*schema*/jobs (queue, priority, available_at, id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');

-- The reaper: RUNNING jobs ordered by lease expiry, so finding the expired
-- ones reads only the expired prefix.
CREATE INDEX jobs_lease_expiry_idx ON /*schema*/jobs (lease_until)
    WHERE state = 'RUNNING';

-- The deadline sweep: waiting jobs with a deadline, so expired ones are found
-- without reading the backlog. Partial: jobs without a deadline cost it
-- nothing.
CREATE INDEX jobs_deadline_idx ON /*schema*/jobs (deadline_at)
    WHERE state IN ('READY', 'RETRY_SCHEDULED') AND deadline_at IS NOT NULL;

-- Tenant-scoped listing, newest first, with keyset pagination on id.
CREATE INDEX jobs_tenant_id_idx ON /*schema*/jobs (tenant, id DESC);

-- Job attempts: one row per claim, never folded together, so every job's
-- history explains itself. A row is written once, when its attempt ends
-- (completion, reaper, release): the live attempt is described by its job
-- row (attempt, fence, lease_owner, attempted_at), which saves a write per
-- attempt on the hot path. No foreign key to jobs, for the same reason:
-- rows are only written next to their job's own update, and retention
-- deletes both.
CREATE TABLE /*schema*/job_attempts (
    job_id        uuid        NOT NULL,
    attempt       integer     NOT NULL,
    fence         bigint      NOT NULL,
    worker        text        NOT NULL,
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL DEFAULT now(),
    outcome       text        NOT NULL,                 -- see jobs.AttemptOutcome
    error_class   text,
    error         text,
    retry_at      timestamptz,
    input_tokens  bigint,
    output_tokens bigint,
    uncertain     boolean     NOT NULL DEFAULT false,   -- the provider may have billed a call whose answer was lost
    PRIMARY KEY (job_id, attempt)
);

-- Transactional outbox: events commit with the state change they describe and
-- leave through a relay that marks them published only after the broker
-- confirmed them.
CREATE TABLE /*schema*/outbox (
    event_id        uuid        PRIMARY KEY,
    seq             bigint      GENERATED ALWAYS AS IDENTITY,  -- write order, for ordered publishing per key
    aggregate_id    uuid,
    topic           text        NOT NULL,
    key             text,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    claimed_until   timestamptz,
    published_at    timestamptz,
    last_error      text
);

-- The relay's work list: unpublished events only, in write order.
CREATE INDEX outbox_pending_idx ON /*schema*/outbox (seq)
    WHERE published_at IS NULL;

