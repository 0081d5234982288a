-- Queries of model routes (lease.Route; migration 0026): what each route
-- candidate did over a recent window. Complete writes the route columns
-- of job_attempts (queries.sql, CompleteJobs); this file only reads them.

-- name: CandidateStats
-- Per (candidate, model), over the attempts that started at or after $1,
-- of tenant $2 (every tenant's when NULL): the attempts that ended on the
-- candidate (job_attempts.candidate) by outcome, with their usage, and the
-- calls of it that failed and moved on (the elements of job_attempts.moves)
-- by failure class. Rows with the most attempts and moves first, at most
-- $3 of them.
--
-- No index serves it: job_attempts has only its primary key (job_id,
-- attempt), and the route columns are deliberately unindexed (migration
-- 0026). It reads the table sequentially and keeps the rows started in the
-- window that carry a route; for a tenant, each kept row probes jobs_pkey
-- (job_attempts has no tenant column). Acceptable because it is an
-- operator's read, not the runner's: `llmq stats` once per call, and the
-- console's admission page on a full load only (never on its refreshes).
-- $1 bounds what is aggregated, not what is read: the cost follows the
-- attempt history retention keeps, one narrow row per attempt (measured:
-- 0.2 to 0.5 s for two million attempts held in memory). An index on
-- started_at would put a write on every completion, the hot path, for
-- this occasional read; should the read grow too slow, a BRIN index
-- (attempts are appended roughly in time order) would cost nearly nothing
-- to keep. moves is only read where it is set, and is always a JSON array
-- of at most MaxMoves elements (jobs.Move, as Complete writes it).
WITH recent AS (
    SELECT a.candidate, a.model, a.outcome, a.input_tokens, a.output_tokens, a.moves
    FROM /*schema*/job_attempts AS a
    WHERE a.started_at >= $1::timestamptz
        AND (a.candidate IS NOT NULL OR a.moves IS NOT NULL)
        AND ($2::text IS NULL OR EXISTS (
            SELECT FROM /*schema*/jobs AS j WHERE j.id = a.job_id AND j.tenant = $2::text))
),
ended AS (
    SELECT candidate, coalesce(model, '') AS model,
        count(*) AS attempts,
        count(*) FILTER (WHERE outcome = 'succeeded') AS succeeded,
        count(*) FILTER (WHERE outcome NOT IN ('succeeded', 'snoozed')) AS failed,
        count(*) FILTER (WHERE outcome = 'snoozed') AS snoozed,
        coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
        coalesce(sum(output_tokens), 0)::bigint AS output_tokens
    FROM recent
    WHERE candidate IS NOT NULL
    GROUP BY 1, 2
),
moved_by_failure AS (
    SELECT coalesce(m.value->>'candidate', '') AS candidate, coalesce(m.value->>'model', '') AS model,
        coalesce(m.value->>'failure', '') AS failure, count(*) AS n
    FROM recent CROSS JOIN LATERAL jsonb_array_elements(recent.moves) AS m (value)
    WHERE jsonb_typeof(recent.moves) = 'array'
    GROUP BY 1, 2, 3
),
moved AS (
    SELECT candidate, model, sum(n)::bigint AS moved_from, jsonb_object_agg(failure, n) AS by_failure
    FROM moved_by_failure
    GROUP BY 1, 2
)
SELECT coalesce(e.candidate, m.candidate) AS candidate, coalesce(e.model, m.model) AS model,
    coalesce(e.attempts, 0) AS attempts, coalesce(e.succeeded, 0) AS succeeded,
    coalesce(e.failed, 0) AS failed, coalesce(e.snoozed, 0) AS snoozed,
    coalesce(m.moved_from, 0) AS moved_from, coalesce(m.by_failure, '{}'::jsonb) AS moved_by_failure,
    coalesce(e.input_tokens, 0) AS input_tokens, coalesce(e.output_tokens, 0) AS output_tokens
FROM ended AS e
FULL JOIN moved AS m ON m.candidate = e.candidate AND m.model = e.model
ORDER BY coalesce(e.attempts, 0) + coalesce(m.moved_from, 0) DESC, 1, 2
LIMIT $3;
