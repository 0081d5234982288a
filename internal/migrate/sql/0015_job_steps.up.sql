-- Durable steps (lease.Step): what a step of a job's handler returned,
-- stored under the fence of the attempt that ran it, so that a later
-- attempt takes the output instead of paying for the call again.
--
-- One row per job and step name, written once (by the first attempt whose
-- step succeeded) and afterwards only appended to in reused_by, by a later
-- attempt that took the output: rare writes, and only on retries. Rows go
-- with their job: the job pruner deletes them in the statement that deletes
-- the job (probing this primary key), as it does the job's attempts.
CREATE TABLE /*schema*/job_steps (
    job_id        uuid        NOT NULL,
    name          text        NOT NULL,
    attempt       integer     NOT NULL,                -- the attempt that ran the step
    fence         bigint      NOT NULL,                -- that attempt's fence
    output        jsonb       NOT NULL,
    input_tokens  bigint      NOT NULL DEFAULT 0,      -- as the step recorded them (lease.RecordUsage)
    output_tokens bigint      NOT NULL DEFAULT 0,
    reused_by     integer[]   NOT NULL DEFAULT '{}',   -- later attempts that took the output
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);
