-- Model routes (lease.Route): an attempt of a routed kind tries its
-- candidates (an admission pool, a model and a provider adapter) in order,
-- and moves to the next one within the same attempt when a call fails in a
-- way another candidate may not (a rate limit, a 5xx, a timeout, an
-- unreachable provider, a context window too small). What an operator
-- then asks of an attempt is which candidate answered and what failed
-- before it; of a durable step, which candidate produced it.
--
-- An attempt records the candidate that made its last call and that
-- candidate's model, and in moves the calls that failed before it, as a
-- JSON array of {candidate, model, failure, error, input_tokens,
-- output_tokens, uncertain} (jobs.Move): at most 16 of them, written once
-- with the attempt's row and read back with it, never queried by their
-- contents, so no index. A step records the candidate whose call produced
-- its output.
--
-- Every column is NULL when unused: an attempt without a route, or one
-- whose first candidate answered, has no moves, and a job of a kind
-- without routes writes nothing more than its row's null bitmap. Adding
-- the columns rewrites nothing (no default).
ALTER TABLE /*schema*/job_attempts
    ADD COLUMN candidate text,
    ADD COLUMN model     text,
    ADD COLUMN moves     jsonb;

ALTER TABLE /*schema*/job_steps
    ADD COLUMN candidate text;
