-- Durable steps (see steps.go): a step's output is stored once, under the
-- fence of the attempt that ran it, and taken by later attempts of the
-- job instead of running the step again.
--
-- The fence check. TakeStep and SaveStep read the job's row FOR SHARE, with
-- the fence the attempt holds, and write only if it is there. As in
-- CompleteJobs the state is implied, not written out: the fence changes
-- whenever a lease begins or ends, so a matching fence means RUNNING under
-- this attempt's lease (and a state predicate would let the planner read
-- jobs_running_tenant_idx, every running job, instead of the primary key).
-- The same rule as a completion's: an attempt whose lease ran out but was
-- not yet taken back may still store its step. A share lock conflicts with the row lock of every statement that
-- moves the fence (a claim, the reaper, a completion, MarkHung): such a
-- statement waits for the step's transaction, or the step's read waits for
-- it and then reads the row's newest version, whose fence has moved on. So
-- a step is stored only while its attempt is the job's current one, and a
-- stale attempt's step is never stored, nor marked as reused. (Claims skip
-- locked rows: a job whose expired lease is being reclaimed while its old
-- attempt stores a step is claimed on the claim after.)

-- name: TakeStep
-- The stored output of step $3 of job $1 for the attempt holding fence $2,
-- and whether that attempt is still current. A later attempt taking an
-- earlier attempt's output is appended to reused_by (once per attempt),
-- which is the only write: a first attempt reads and writes nothing.
-- Probes the job's primary key and job_steps' (job_id, name).
WITH holder AS (
    SELECT attempt
    FROM /*schema*/jobs
    WHERE id = $1 AND fence = $2
    FOR SHARE
),
reused AS (
    UPDATE /*schema*/job_steps AS s
    SET reused_by = s.reused_by || h.attempt
    FROM holder AS h
    WHERE s.job_id = $1 AND s.name = $3
        AND s.attempt <> h.attempt
        AND NOT (h.attempt = ANY (s.reused_by))
    RETURNING s.job_id
)
SELECT EXISTS (SELECT FROM holder), s.attempt, s.output, s.input_tokens, s.output_tokens, s.reused_by, s.created_at,
    s.candidate
FROM (SELECT) AS one
LEFT JOIN /*schema*/job_steps AS s ON s.job_id = $1 AND s.name = $3;

-- name: SaveStep
-- Stores step $3's output $4 (with the usage $5, $6 it recorded, and $7
-- the route candidate whose call produced it, NULL outside a route) for
-- the attempt holding fence $2 of job $1, if that attempt is still current.
-- The first store of a name wins (ON CONFLICT DO NOTHING): the stored step
-- is returned, whichever attempt stored it; no row with a current attempt
-- means one stored concurrently after this statement's snapshot, which the
-- caller reads with TakeStep.
WITH holder AS (
    SELECT attempt
    FROM /*schema*/jobs
    WHERE id = $1 AND fence = $2
    FOR SHARE
),
saved AS (
    INSERT INTO /*schema*/job_steps (job_id, name, attempt, fence, output, input_tokens, output_tokens, candidate)
    SELECT $1, $3, h.attempt, $2, $4::jsonb, $5, $6, $7::text
    FROM holder AS h
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING attempt, output, input_tokens, output_tokens, reused_by, created_at, candidate
),
stored AS (
    SELECT attempt, output, input_tokens, output_tokens, reused_by, created_at, candidate FROM saved
    UNION ALL
    SELECT attempt, output, input_tokens, output_tokens, reused_by, created_at, candidate
    FROM /*schema*/job_steps
    WHERE job_id = $1 AND name = $3 AND NOT EXISTS (SELECT FROM saved)
)
SELECT EXISTS (SELECT FROM holder), s.attempt, s.output, s.input_tokens, s.output_tokens, s.reused_by, s.created_at,
    s.candidate
FROM (SELECT) AS one
LEFT JOIN stored AS s ON true;

-- name: ListSteps
-- A tenant's job's stored steps in the order they were stored. The join
-- keeps the read tenant-scoped; job_steps' primary key gives the job's
-- rows.
SELECT s.job_id, s.name, s.attempt, s.output, s.input_tokens, s.output_tokens, s.reused_by, s.created_at,
    s.candidate
FROM /*schema*/job_steps AS s
JOIN /*schema*/jobs AS j ON j.id = s.job_id
WHERE j.tenant = $1 AND s.job_id = $2
ORDER BY s.created_at, s.name;
