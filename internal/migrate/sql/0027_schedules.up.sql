-- Periodic jobs (package schedule): a schedule enqueues one job per slot
-- of its cron expression or interval, once across the fleet.
--
-- A row is the schedule's spec (cron XOR every_ms, the zone, jitter,
-- misfire policy and the job to enqueue) and its progress: next_slot is
-- the next slot to enqueue (NULL: the cron has no further slot), last_slot
-- and last_job the latest slot enqueued and its job. source says who owns
-- the row: 'code' rows are upserted by every scheduler at start from its
-- Config.Schedules (spec replaced, paused and progress kept), 'operator'
-- rows are written by Store.Put. The table holds a handful of rows, read
-- whole by the active scheduler every tick through schedules_due.
CREATE TABLE /*schema*/schedules (
    name             text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    cron             text,                 -- robfig/cron standard spec; NULL with every_ms
    every_ms         bigint CHECK (every_ms >= 1000),
    time_zone        text        NOT NULL DEFAULT 'UTC',
    jitter_ms        bigint      NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0),
    misfire          text        NOT NULL DEFAULT 'skip' CHECK (misfire IN ('skip', 'catch_up')),
    catch_up_max     integer     NOT NULL DEFAULT 1 CHECK (catch_up_max >= 1),
    -- The job each slot enqueues (jobs.EnqueueParams); the idempotency
    -- key is the slot's, set by the scheduler.
    tenant           text        NOT NULL,
    kind             text        NOT NULL,
    queue            text        NOT NULL DEFAULT '',
    priority         integer     NOT NULL DEFAULT 0,
    payload          jsonb       NOT NULL DEFAULT '{}',
    group_key        text        NOT NULL DEFAULT '',
    max_attempts     integer     NOT NULL DEFAULT 0,
    estimated_tokens bigint      NOT NULL DEFAULT 0,

    paused           boolean     NOT NULL DEFAULT false,
    next_slot        timestamptz,
    last_slot        timestamptz,
    last_job         uuid,
    last_enqueued_at timestamptz,
    source           text        NOT NULL CHECK (source IN ('code', 'operator')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
);

-- The active scheduler's search for due schedules: unpaused, next_slot
-- reached.
CREATE INDEX schedules_due ON /*schema*/schedules (next_slot) WHERE NOT paused;

-- The schedulers' leader lease, as outbox_relay_lease: of all schedulers
-- on this schema, the one named by holder enqueues; the others stand by
-- and take the lease over when lease_until has passed without a renewal.
-- A scheduler that stops sets lease_until to '-infinity'. epoch grows with
-- every acquisition and fences the holder's writes: a slot is enqueued
-- only in a transaction that holds this row FOR SHARE with the epoch its
-- scheduler acquired, so a scheduler that lost the lease writes nothing.
CREATE TABLE /*schema*/schedule_lease (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),  -- the one row
    holder      text,                                             -- Config.Holder; NULL: never held
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);

INSERT INTO /*schema*/schedule_lease DEFAULT VALUES;
