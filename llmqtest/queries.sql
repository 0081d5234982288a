-- Queries of llmqtest's schema pool. Tables are written /*schema*/name and
-- rendered for one pooled schema; $1 is always that schema's name.

-- name: CreateReset
-- Installed once in a schema after it is migrated. With capture, it copies
-- every row the migrations themselves wrote (the default tenant_limits row)
-- into llmqtest_seed; without, it empties every llmq table but migrations
-- and llmqtest_seed in one TRUNCATE and puts the seed rows back. TRUNCATE
-- takes an ACCESS EXCLUSIVE lock on each table, harmless here: the schema
-- is held by one test at a time (an advisory lock on its name), and it
-- costs a few milliseconds where a migration costs hundreds.
CREATE FUNCTION /*schema*/llmqtest_reset(sch text, capture boolean) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t record;
    tables text;
BEGIN
    IF capture THEN
        EXECUTE format('CREATE TABLE %I.llmqtest_seed (tbl text PRIMARY KEY, rows jsonb NOT NULL)', sch);
        FOR t IN
            SELECT tablename FROM pg_tables
            WHERE schemaname = sch AND tablename NOT IN ('migrations', 'llmqtest_seed')
        LOOP
            EXECUTE format(
                'INSERT INTO %I.llmqtest_seed (tbl, rows) SELECT %L, jsonb_agg(to_jsonb(r)) FROM %I.%I r HAVING count(*) > 0',
                sch, t.tablename, sch, t.tablename);
        END LOOP;
        RETURN;
    END IF;
    SELECT string_agg(format('%I.%I', sch, tablename), ', ') INTO tables
    FROM pg_tables
    WHERE schemaname = sch AND tablename NOT IN ('migrations', 'llmqtest_seed');
    EXECUTE 'TRUNCATE ' || tables || ' RESTART IDENTITY CASCADE';
    FOR t IN EXECUTE format('SELECT tbl, rows FROM %I.llmqtest_seed', sch) LOOP
        EXECUTE format('INSERT INTO %I.%I SELECT * FROM jsonb_populate_recordset(NULL::%I.%I, $1)',
            sch, t.tbl, sch, t.tbl) USING t.rows;
    END LOOP;
END
$fn$;

-- name: Capture
SELECT /*schema*/llmqtest_reset($1, true);

-- name: Reset
SELECT /*schema*/llmqtest_reset($1, false);

-- name: Ready
-- A schema is ready for reuse once its seed table exists: it is created
-- last, after every migration, in the transaction that installs the reset
-- function.
SELECT to_regclass(format('%I.llmqtest_seed', $1::text)) IS NOT NULL;

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
