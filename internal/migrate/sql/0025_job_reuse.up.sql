-- Result reuse (jobs.Reuse): a job that opts in names a key the host
-- computed from what determines its answer, whether the key is shared
-- across tenants, and how old a result it accepts. A job whose key has a
-- SUCCEEDED result in scope, young enough, takes that result instead of
-- calling its handler, and records the job it came from in reused_from;
-- jobs with the same key never run at once (in-flight coalescing).
--
-- The four columns are NULL for every job that does not opt in: adding
-- them rewrites nothing (no default), and such a job costs nothing more
-- than its row's null bitmap.
ALTER TABLE /*schema*/jobs
    ADD COLUMN reuse_key    text,
    ADD COLUMN reuse_shared boolean,
    ADD COLUMN reuse_ttl_ms bigint,
    ADD COLUMN reused_from  uuid;

-- An attempt that reused a result names its source, as its job does.
ALTER TABLE /*schema*/job_attempts
    ADD COLUMN reused_from uuid;

-- Locks: both indexes are built in the migration's transaction, not
-- CONCURRENTLY, each under a SHARE lock on jobs (writes wait, reads go
-- on) while it reads the table once. No existing row has a key, so the
-- builds write next to nothing; on a large table, migrate at a quiet time.
--
-- The results a claim may reuse: computed (not themselves reused, so a
-- result's age is always its computation's, however often it was reused)
-- SUCCEEDED jobs with a key, newest last per key. A claimed job's probe
-- reads one key's entries newest first and stops at the first of its kind
-- and scope. Its entries go with their jobs when retention prunes them.
CREATE INDEX jobs_reuse_source_idx ON /*schema*/jobs (reuse_key, finished_at)
    WHERE state = 'SUCCEEDED' AND reuse_key IS NOT NULL AND reused_from IS NULL;

-- The running jobs with a key: a claim passes over a job whose key is
-- already running (coalescing). Only running jobs that opted in are in it,
-- so it stays as small as the work in flight.
CREATE INDEX jobs_reuse_running_idx ON /*schema*/jobs (reuse_key)
    WHERE state = 'RUNNING' AND reuse_key IS NOT NULL;

-- Operators' invalidations (llmq reuse invalidate): a result whose attempt
-- started at or before invalidated_at is never reused again if it is of
-- kind, has key (every key of the kind when NULL) and was computed by a
-- job of tenant (every tenant's when NULL). The row is a cut in time, so
-- invalidating every key of a kind costs one row however many results it
-- covers, and the results stay as they are, still explainable. Retention
-- prunes a row once every result it could cover is gone.
CREATE TABLE /*schema*/job_reuse_invalidations (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           text        NOT NULL,
    reuse_key      text,
    tenant         text,
    invalidated_at timestamptz NOT NULL DEFAULT now(),
    invalidated_by text        NOT NULL,
    reason         text        NOT NULL
);

CREATE INDEX job_reuse_invalidations_kind_idx ON /*schema*/job_reuse_invalidations (kind, invalidated_at);
