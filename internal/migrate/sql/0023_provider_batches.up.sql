-- Provider batch submissions (package providerbatch): jobs served by a
-- provider's batch API (OpenAI's Batch API, Anthropic's Message Batches)
-- at its batch price.

-- The submitters' leases: one row per provider pool. Submitters may run
-- in every process; only the holder of its pool's row submits, polls and
-- applies results. epoch grows with every acquisition and fences the
-- holder's writes: a submitter writes only while the row still names it
-- with the epoch it acquired, so one that lost the lease (paused past it,
-- cut off from the database) writes nothing when it comes back.
CREATE TABLE /*schema*/provider_batch_leases (
    pool        text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    lease_until timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);

-- One row per provider batch llmq sends, written before the provider is
-- called: its id is llmq's own, and goes into the provider batch's
-- metadata (OpenAI) so that a submitter taking over can find a batch its
-- predecessor created but did not record (state 'preparing' with no
-- provider_batch_id). state: 'preparing' (recorded, the provider not yet
-- known to hold it), 'submitted' (provider_batch_id known, polled),
-- 'ended' (every item applied or returned).
CREATE TABLE /*schema*/provider_submissions (
    id                uuid        PRIMARY KEY,
    pool              text        NOT NULL,
    provider          text        NOT NULL,
    model             text        NOT NULL,
    queue             text        NOT NULL,
    state             text        NOT NULL DEFAULT 'preparing'
                                  CHECK (state IN ('preparing', 'submitted', 'ended')),
    provider_batch_id text,
    provider_status   text,
    requests          integer     NOT NULL,
    bytes             bigint      NOT NULL,
    estimated_tokens  bigint      NOT NULL,
    succeeded         integer     NOT NULL DEFAULT 0,  -- items applied as SUCCEEDED
    failed            integer     NOT NULL DEFAULT 0,  -- items applied as any other outcome
    stale             integer     NOT NULL DEFAULT 0,  -- results whose job no longer waited on this submission
    returned          integer     NOT NULL DEFAULT 0,  -- items returned to waiting without a result
    skipped           integer     NOT NULL DEFAULT 0,  -- result lines that could not be read
    cancel_requested  boolean     NOT NULL DEFAULT false,
    polls             integer     NOT NULL DEFAULT 0,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    submitted_at      timestamptz,
    ended_at          timestamptz,
    next_poll_at      timestamptz NOT NULL DEFAULT now()
);

-- The submitter's work list: its pool's open submissions, soonest poll
-- first. Partial, so ended submissions kept for the operator's history
-- cost the poll nothing.
CREATE INDEX provider_submissions_open_idx ON /*schema*/provider_submissions (pool, next_poll_at)
    WHERE state <> 'ended';

-- Listing newest first (llmq batches list, the console) and pruning.
CREATE INDEX provider_submissions_created_idx ON /*schema*/provider_submissions (created_at);

-- The jobs of a submission, each under the fence of the attempt the
-- submission is: a result is applied only under that fence, so a job
-- cancelled, finished or replayed meanwhile records it as stale. outcome
-- is NULL until the item's result is applied (the job's new state), or it
-- is 'stale' or 'returned'; an item with an outcome is never applied again.
CREATE TABLE /*schema*/provider_submission_items (
    submission_id uuid    NOT NULL REFERENCES /*schema*/provider_submissions (id) ON DELETE CASCADE,
    job_id        uuid    NOT NULL,
    tenant        text    NOT NULL,
    kind          text    NOT NULL,
    fence         bigint  NOT NULL,
    attempt       integer NOT NULL,
    outcome       text,
    PRIMARY KEY (submission_id, job_id)
);
