-- The operator's listing of every tenant's jobs. It is a file of its own,
-- parsed with queries.sql (for the job_columns fragment) when ListAll runs:
-- an operator's command, not a hot path.

-- name: ListAllJobs
-- Every tenant's jobs, newest first, with keyset pagination on the
-- time-ordered id: walks jobs' primary key backwards from the cursor and
-- applies the state and kind filters on the way, so a filter that matches
-- few jobs reads many rows to fill a page (LIMIT bounds what it returns,
-- not what it reads). A tenant's listing uses ListJobs instead.
SELECT
    /*job_columns*/
FROM /*schema*/jobs
WHERE (cardinality($1::text[]) = 0 OR state = ANY ($1::text[]))
    AND ($2::text = '' OR kind = $2::text)
    AND ($3::uuid IS NULL OR id < $3::uuid)
ORDER BY id DESC
LIMIT $4;
