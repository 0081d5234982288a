-- Batches of jobs (jobs.Store.EnqueueBatch): one row per batch with its
-- progress, kept by the statements that finish its jobs, in the same
-- statement as each job's own transition. So a batch's counts always agree
-- with its jobs' states, at any snapshot, and are read in one primary-key
-- probe whatever the batch's size. The statement whose update brings
-- finished to total writes the batch's one "batch.completed" event: the
-- batch's row lock serialises the statements that finish its last jobs.
CREATE TABLE /*schema*/job_batches (
    id              uuid        PRIMARY KEY,
    tenant          text        NOT NULL,
    batch_key       text        NOT NULL,              -- the caller's idempotency key for the whole batch
    request_hash    text        NOT NULL,              -- of the jobs it was accepted with: the same key with other jobs is refused
    topic           text        NOT NULL,              -- the outbox topic of its completion event
    total           integer     NOT NULL,
    finished        integer     NOT NULL DEFAULT 0,    -- jobs in a terminal state: the sum of the four below
    succeeded       integer     NOT NULL DEFAULT 0,
    review_required integer     NOT NULL DEFAULT 0,
    failed          integer     NOT NULL DEFAULT 0,
    cancelled       integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,                       -- when its last job finished
    UNIQUE (tenant, batch_key)
);

-- Finished batches by age, for retention (jobs.Pruner.PruneBatches).
-- Partial: an open batch has no entry, so the updates of its counts while
-- its jobs finish change no indexed column and stay heap-only; its last
-- update, which sets finished_at, adds the one entry.
CREATE INDEX job_batches_finished_idx ON /*schema*/job_batches (finished_at) WHERE finished_at IS NOT NULL;

-- A job's batch. Adding a nullable column only changes the catalog.
ALTER TABLE /*schema*/jobs ADD COLUMN batch_id uuid;

-- A batch's jobs, for CancelBatch. Partial: a job outside any batch has no
-- entry and pays nothing for it; batch_id never changes, so the index
-- costs no heap-only update either. Building it reads the whole jobs table
-- once, blocking writes to jobs meanwhile (as 0013 did).
CREATE INDEX jobs_batch_idx ON /*schema*/jobs (batch_id) WHERE batch_id IS NOT NULL;
