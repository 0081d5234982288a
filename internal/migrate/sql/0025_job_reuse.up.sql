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

-- One index serves both questions a claim asks of a waiting job's key
-- (ClaimJobs' reuse_probe), in one probe: is a job with this key running
-- (then the job waits for its result: in-flight coalescing), and else
-- which computed success of this key is the newest (its result is taken).
-- It holds the running jobs with a key and the SUCCEEDED ones that
-- computed their result (not those that reused one, so a result's age is
-- always its computation's, however often it was reused). A job without a
-- key is never in it, so what it costs follows the work that opted in:
-- an entry at the claim and one at a computed success. Entries go with
-- their jobs when retention prunes them.
--
-- Locks: built in the migration's transaction, not CONCURRENTLY, under a
-- SHARE lock on jobs (writes wait, reads go on) while it reads the table
-- once. No existing row has a key, so the build writes next to nothing;
-- on a large table, migrate at a quiet time.
CREATE INDEX jobs_reuse_idx ON /*schema*/jobs (reuse_key)
    WHERE reuse_key IS NOT NULL AND (state = 'RUNNING' OR (state = 'SUCCEEDED' AND reused_from IS NULL));

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
