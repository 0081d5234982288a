-- Queries of llmqtest's schema pool. Tables are written /*schema*/name and
-- rendered for one pooled schema; $1 is always that schema's name.

-- name: CreateCapture
-- Installed once in a schema right after it is migrated, and run at once
-- (Capture). It copies every row the migrations themselves wrote (the
-- default tenant_limits row) into llmqtest_seed, and writes
-- llmqtest_clear(): a function that drops what tests added to the schema,
-- empties every llmq table but migrations and llmqtest_seed with plain
-- statements, and puts the seed rows back.
--
-- DELETE, not TRUNCATE: on a test's few rows a DELETE costs a fraction of
-- a millisecond, where TRUNCATE makes new files for every table (80-100 ms
-- for the schema). Tables are emptied children first (depth: the longest
-- chain of foreign keys pointing at a table), so no foreign key is ever
-- violated. The order is worked out here, once: the catalog query costs
-- more in a fresh session (about 30 ms) than all the DELETEs. Sequences
-- are not reset. The schema is held by one test at a time (an advisory
-- lock on its name), so nothing else writes while it is cleared.
CREATE FUNCTION /*schema*/llmqtest_capture(sch text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t record;
    body text := '';
    seeds text := '';
    known text;
    n bigint;
BEGIN
    EXECUTE format('CREATE TABLE %I.llmqtest_seed (tbl text PRIMARY KEY, rows jsonb NOT NULL)', sch);
    FOR t IN
        WITH RECURSIVE tbls AS (
            SELECT c.oid AS rel FROM pg_class c
            WHERE c.relnamespace = sch::regnamespace AND c.relkind = 'r'
              AND c.relname NOT IN ('migrations', 'llmqtest_seed')
        ), refs AS (
            SELECT conrelid AS child, confrelid AS parent FROM pg_constraint
            WHERE contype = 'f' AND connamespace = sch::regnamespace AND conrelid <> confrelid
        ), depth (rel, d) AS (
            SELECT rel, 0 FROM tbls
            UNION ALL
            SELECT r.parent, depth.d + 1 FROM depth JOIN refs r ON r.child = depth.rel WHERE depth.d < 64
        )
        SELECT c.relname AS tbl FROM depth JOIN pg_class c ON c.oid = depth.rel
        GROUP BY c.relname ORDER BY max(d), c.relname
    LOOP
        body := body || format('DELETE FROM %I.%I; ', sch, t.tbl);
        EXECUTE format(
            'INSERT INTO %I.llmqtest_seed (tbl, rows) SELECT %L, jsonb_agg(to_jsonb(r)) FROM %I.%I r HAVING count(*) > 0',
            sch, t.tbl, sch, t.tbl);
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            -- Seeds go back after every DELETE, parents first: the reverse
            -- of the DELETE order.
            seeds := format('INSERT INTO %I.%I SELECT * FROM jsonb_populate_recordset(NULL::%I.%I, (SELECT rows FROM %I.llmqtest_seed WHERE tbl = %L)); ',
                sch, t.tbl, sch, t.tbl, sch, t.tbl) || seeds;
        END IF;
    END LOOP;
    -- Relations a test creates in the schema (a host's own tables) are
    -- dropped by the next clear, so a test may CREATE TABLE without IF NOT
    -- EXISTS: known lists every relation there is now, by oid.
    SELECT string_agg(c.oid::text, ',') INTO known FROM pg_class c WHERE c.relnamespace = sch::regnamespace;
    EXECUTE format($body$
        CREATE FUNCTION %I.llmqtest_clear() RETURNS void LANGUAGE plpgsql AS $clear$
        DECLARE
            r record;
        BEGIN
            FOR r IN
                SELECT c.oid::regclass AS rel, CASE c.relkind
                    WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                    WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END AS what
                FROM pg_class c
                WHERE c.relnamespace = %L::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
                  AND c.oid <> ALL ('{%s}'::oid[])
                  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i'))
            LOOP
                EXECUTE format('DROP %%s IF EXISTS %%s CASCADE', r.what, r.rel);
            END LOOP;
            %s
        END
        $clear$
    $body$, sch, sch, known, body || seeds);
END
$fn$;

-- name: Capture
SELECT /*schema*/llmqtest_capture($1);

-- name: Clear
SELECT /*schema*/llmqtest_clear();

-- name: Ready
-- A schema is ready for reuse once llmqtest_clear exists: it is created
-- last, after every migration, in the transaction that captures the seed.
SELECT to_regprocedure(format('%I.llmqtest_clear()', $1::text)) IS NOT NULL;

-- name: Idle
-- Whether the runner has nothing left to do in the test's queues: no job
-- RUNNING, and none of the served kinds eligible now or within $3 (the
-- longest retry backoff the runner uses in tests), so a job between two
-- attempts is waited for. Jobs of kinds no handler serves and jobs
-- scheduled later are left as they are. Reads the whole (small) table.
SELECT NOT EXISTS (
    SELECT 1 FROM /*schema*/jobs
    WHERE queue = ANY($1::text[])
      AND (state = 'RUNNING'
           OR (state IN ('READY', 'RETRY_SCHEDULED')
               AND kind = ANY($2::text[])
               AND available_at <= now() + $3::interval))
);

-- name: UnservedKinds
-- The kinds of jobs waiting in the test's queues ($1) that no handler of
-- the runner ($2) serves: a misspelt kind shows up here. Reads the whole
-- (small) table.
SELECT DISTINCT kind FROM /*schema*/jobs
WHERE queue = ANY($1::text[])
  AND state IN ('READY', 'RETRY_SCHEDULED')
  AND NOT (kind = ANY($2::text[]))
ORDER BY kind;
