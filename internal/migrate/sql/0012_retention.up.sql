-- Retention: the maintenance service's lease, and the indexes its deletes
-- read.

-- The retention lease: every runner process runs the maintenance service,
-- and the one named by holder prunes; the others check now and then and
-- take the lease over when lease_until has passed without a renewal. One
-- row, so it is found without a key. Every pruning batch renews it first,
-- in the batch's own transaction, under the row lock: a takeover waits for
-- that batch to commit, and the old holder's next batch finds the row no
-- longer names it, so two processes never prune at once.
--
-- policy is the retention the holder prunes by, and last_pass what its
-- last pass deleted, for operators (llmq stats, llmq prune --dry-run).
CREATE TABLE /*schema*/retention_lease (
    id           boolean     PRIMARY KEY DEFAULT true CHECK (id),  -- the one row
    holder       text,                                             -- Config.ID; NULL: free
    lease_until  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at  timestamptz,
    policy       jsonb,
    last_pass_at timestamptz,
    last_pass    jsonb
);

INSERT INTO /*schema*/retention_lease DEFAULT VALUES;

-- Finished jobs by state and finish time: the pruner deletes each state's
-- oldest first, reading only the entries past that state's retention,
-- whatever the other states keep. Partial: a waiting or running job has no
-- entry, and a job gets its one entry when it finishes (its finishing
-- update writes an entry to every index anyway, a state change is never
-- heap-only). The claim's indexes are unchanged.
--
-- Built without CONCURRENTLY (a migration runs in a transaction): on a
-- large jobs table it blocks writes while it builds; migrate at a quiet
-- time.
CREATE INDEX jobs_finished_idx ON /*schema*/jobs (state, finished_at)
    WHERE finished_at IS NOT NULL;

-- replay_of references jobs ON DELETE SET NULL: deleting a job makes
-- PostgreSQL look for replays pointing at it. Without an index that is a
-- sequential scan of jobs for every deleted job. Partial: only replays
-- have an entry.
CREATE INDEX jobs_replay_of_idx ON /*schema*/jobs (replay_of)
    WHERE replay_of IS NOT NULL;
