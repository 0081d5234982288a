-- WAL bytes per event of an outbox that stores one row per writing
-- statement (all of its events in one jsonb array) instead of one row per
-- event: the shape proposed for storage v2 (docs/performance.md, "Storage
-- v2"). It writes 100,000 job events shaped like the job store's
-- "<kind>.requested" events, :batch per row, then claims, publishes, deletes
-- and vacuums them, one statement per phase, and prints the WAL each phase
-- wrote per event. With -v pending=on the rows are never updated: each has
-- a narrow row in outbox_pending while any of its events is unpublished,
-- which the claim updates and the publication deletes. With -v keys=gin
-- as well, each pending row also holds the keys of its row's events, in a
-- GIN index, as a claim's key-order probe ("no earlier pending row holds
-- one of my keys") would need. Run it on a server nothing else writes to:
--
--   psql -X -q -v batch=100 -v pending=off -f scripts/outbox-rows-wal.sql
--
-- It works in the schema outbox_rows_wal, which it drops at the start and
-- the end. The server's default_toast_compression applies (pglz unless
-- set); lz4 measured the same within 4 %.
\set ON_ERROR_STOP on
\if :{?keys}
\else
\set keys none
\endif
DROP SCHEMA IF EXISTS outbox_rows_wal CASCADE;
CREATE SCHEMA outbox_rows_wal;
CREATE TABLE outbox_rows_wal.source AS
SELECT n, gen_random_uuid() AS id FROM generate_series(1, 100000) AS n;
CREATE INDEX ON outbox_rows_wal.source (n);
CREATE TABLE outbox_rows_wal.outbox (
    seq           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    n             integer     NOT NULL,
    events        jsonb       NOT NULL,
    claimed_by    text,
    claimed_until timestamptz,
    published_at  timestamptz
);
CREATE TABLE outbox_rows_wal.outbox_pending (
    seq           bigint      PRIMARY KEY,
    claimed_by    text,
    claimed_until timestamptz,
    attempts      integer     NOT NULL DEFAULT 0,
    keys          text[]
) WITH (fillfactor = 50);
SELECT :'pending' = 'on' AS with_pending, :'keys' = 'gin' AS with_keys \gset
\if :with_keys
CREATE INDEX ON outbox_rows_wal.outbox_pending USING gin (keys);
\endif
\if :with_pending
\else
CREATE INDEX ON outbox_rows_wal.outbox (seq) WHERE published_at IS NULL;
CREATE INDEX ON outbox_rows_wal.outbox (published_at) WHERE published_at IS NOT NULL;
\endif
CHECKPOINT;

SELECT pg_current_wal_insert_lsn() AS before_insert \gset
-- One statement per row, as a job store's batch statement writes one.
SELECT CASE WHEN :'pending' = 'on' THEN 'WITH r AS (' ELSE '' END || format($$
    INSERT INTO outbox_rows_wal.outbox (n, events)
    SELECT count(*), jsonb_agg(jsonb_build_object(
        'id', gen_random_uuid(), 'aggregate_id', s.id, 'topic', 'llmq.jobs', 'key', s.id::text,
        'type', 'bench.noop.requested',
        'payload', jsonb_build_object('job_id', s.id, 'tenant', 'tenant-1', 'kind', 'bench.noop',
            'queue', 'default', 'state', 'PENDING', 'state_version', 1, 'attempt', 0)) ORDER BY s.n)
    FROM outbox_rows_wal.source AS s
    WHERE s.n > %1$s AND s.n <= %1$s + %2$s
    $$, first, :batch) || CASE WHEN :'pending' = 'on'
        THEN ' RETURNING seq, events) INSERT INTO outbox_rows_wal.outbox_pending (seq, keys) SELECT seq, '
            || CASE WHEN :'keys' = 'gin' THEN '(SELECT array_agg(e->>''key'') FROM jsonb_array_elements(events) AS e)' ELSE 'NULL' END
            || ' FROM r' ELSE '' END
FROM generate_series(0, 100000 - 1, :batch) AS first
\gexec
SELECT pg_current_wal_insert_lsn() AS before_claim \gset
\if :with_pending
UPDATE outbox_rows_wal.outbox_pending SET claimed_by = 'relay', claimed_until = now() + interval '30 seconds', attempts = attempts + 1;
SELECT pg_current_wal_insert_lsn() AS before_publish \gset
DELETE FROM outbox_rows_wal.outbox_pending;
\else
UPDATE outbox_rows_wal.outbox SET claimed_by = 'relay', claimed_until = now() + interval '30 seconds';
SELECT pg_current_wal_insert_lsn() AS before_publish \gset
UPDATE outbox_rows_wal.outbox SET published_at = now(), claimed_by = NULL, claimed_until = NULL;
\endif
SELECT pg_current_wal_insert_lsn() AS before_delete \gset
DELETE FROM outbox_rows_wal.outbox;
SELECT pg_current_wal_insert_lsn() AS before_vacuum \gset
VACUUM outbox_rows_wal.outbox, outbox_rows_wal.outbox_pending;
SELECT pg_current_wal_insert_lsn() AS after_vacuum \gset

SELECT :batch AS events_per_row, :'pending' AS pending_table, :'keys' AS keys,
    round(pg_wal_lsn_diff(:'before_claim', :'before_insert') / 100000) AS insert,
    round(pg_wal_lsn_diff(:'before_publish', :'before_claim') / 100000, 1) AS claim,
    round(pg_wal_lsn_diff(:'before_delete', :'before_publish') / 100000, 1) AS publish,
    round(pg_wal_lsn_diff(:'after_vacuum', :'before_delete') / 100000, 1) AS delete_and_vacuum;
DROP SCHEMA outbox_rows_wal CASCADE;
