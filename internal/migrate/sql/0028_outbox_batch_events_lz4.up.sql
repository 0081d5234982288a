-- A batch row's events are compressed with lz4 where the server has it.
-- The events of a completion of hundreds of jobs run to tens of kilobytes
-- of json text, compressed when the row is written and again read whole
-- by the relay: pglz, PostgreSQL's default, spent about a tenth of a
-- completion's CPU on them; lz4 about a third of that, for nearly the same
-- size.
--
-- Only rows written from now on are compressed with lz4: the column's
-- setting changes in the catalog and the table is not rewritten, so
-- existing rows keep pglz and stay readable. The ALTER takes the table's
-- ACCESS EXCLUSIVE lock for that catalog change alone, waiting for the
-- statements on it that run. A server built without lz4 (it is optional
-- at build time; PostgreSQL's own packages have it) keeps pglz.
DO $$
BEGIN
    IF EXISTS (
        SELECT FROM pg_settings
        WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)
    ) THEN
        ALTER TABLE /*schema*/outbox_batches ALTER COLUMN events SET COMPRESSION lz4;
    END IF;
END
$$;
