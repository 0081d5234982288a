-- The relay's cost for "batch rows", the outbox shape proposed for storage v2
-- (docs/performance.md, "What the targets need, and batch rows that split
-- on failure"), against the outbox of one row per event the relay claims
-- today. It writes 100,000
-- job events of each shape, :per_row per statement: single-event rows as
-- the job store's statements write them now, and batch rows (all of a
-- statement's events in one jsonb array, each event with its own seq from
-- the outbox's sequence, the claim state on the row). Then it relays each:
-- today's claim of :batch events (key-order probe per event, update per
-- event) followed by the publication's update, and the batch rows' claim
-- of whole rows up to :batch events, whose events are read out of the
-- array and probed against the single-event rows' key index, followed by
-- one update per row. The batch rows' claim stands in for the cost only:
-- it takes unclaimed rows in seq order, where the design's relay also
-- waits for every earlier unpublished row, claimed elsewhere or not.
-- Relaying runs in PL/pgSQL, so the figures are the server's time and WAL
-- alone (no client decodes anything). It prints
-- milliseconds and WAL bytes per event for each phase. Run it on a server
-- nothing else writes to:
--
--   psql -X -q -v batch=500 -v per_row=100 -f scripts/outbox-batch-rows.sql
--
-- It works in the schema outbox_batch_rows, which it drops at the start and
-- the end. A CHECKPOINT comes before the relaying, so the relay's first
-- touch of each page writes its full image, the same for both shapes.
\set ON_ERROR_STOP on
DROP SCHEMA IF EXISTS outbox_batch_rows CASCADE;
CREATE SCHEMA outbox_batch_rows;
CREATE TABLE outbox_batch_rows.source AS SELECT n, gen_random_uuid() AS id FROM generate_series(1, 100000) AS n;
CREATE INDEX ON outbox_batch_rows.source (n);
CREATE TABLE outbox_batch_rows.outbox (
    event_id uuid PRIMARY KEY, seq bigint GENERATED ALWAYS AS IDENTITY, aggregate_id uuid,
    topic text NOT NULL, key text, event_type text NOT NULL, payload jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by text, claimed_until timestamptz, published_at timestamptz, last_error text
) WITH (fillfactor = 50);
CREATE INDEX outbox_pending_idx ON outbox_batch_rows.outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_pending_key_idx ON outbox_batch_rows.outbox ((hashtextextended(key, 0)), seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published_idx ON outbox_batch_rows.outbox (published_at) WHERE published_at IS NOT NULL;
CREATE TABLE outbox_batch_rows.outbox_batch (
    seq bigint PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(), n integer NOT NULL,
    events jsonb NOT NULL, attempts integer NOT NULL DEFAULT 0,
    claimed_by text, claimed_until timestamptz, published_at timestamptz
) WITH (fillfactor = 50);
CREATE INDEX outbox_batch_pending_idx ON outbox_batch_rows.outbox_batch (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_batch_published_idx ON outbox_batch_rows.outbox_batch (published_at) WHERE published_at IS NOT NULL;
VACUUM ANALYZE outbox_batch_rows.source;
SELECT set_config('outbox_batch_rows.batch', :'batch', false);
CHECKPOINT;

CREATE FUNCTION outbox_batch_rows.ms(t0 timestamptz) RETURNS numeric LANGUAGE sql AS $$ SELECT round(extract(epoch FROM clock_timestamp() - t0)::numeric * 1000, 1) $$;

-- 1. write singles, :per_row events per statement
SELECT pg_current_wal_insert_lsn() AS l0, clock_timestamp() AS t0 \gset
SELECT format($$INSERT INTO outbox_batch_rows.outbox (event_id, aggregate_id, topic, key, event_type, payload)
    SELECT gen_random_uuid(), s.id, 'llmq.jobs', s.id::text, 'bench.noop.requested',
        jsonb_build_object('job_id', s.id, 'tenant', 'bench', 'kind', 'bench.noop', 'queue', 'default', 'state', 'READY', 'state_version', 1, 'attempt', 0)
    FROM outbox_batch_rows.source s WHERE s.n > %1$s AND s.n <= %1$s + %2$s$$, first, :per_row)
FROM generate_series(0, 100000 - 1, :per_row) AS first \gexec
SELECT outbox_batch_rows.ms(:'t0') AS write_single_ms, round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'l0') / 100000) AS write_single_b \gset

-- 2. write batch rows, one per statement, an event seq each from the same sequence
SELECT pg_current_wal_insert_lsn() AS l0, clock_timestamp() AS t0 \gset
SELECT format($$WITH ev AS (
        SELECT nextval('outbox_batch_rows.outbox_seq_seq') AS seq, s.id, s.n FROM outbox_batch_rows.source s
        WHERE s.n > %1$s AND s.n <= %1$s + %2$s ORDER BY s.n)
    INSERT INTO outbox_batch_rows.outbox_batch (seq, n, events)
    SELECT min(seq), count(*), jsonb_agg(jsonb_build_object(
        'seq', seq, 'id', gen_random_uuid(), 'aggregate_id', id, 'topic', 'llmq.jobs', 'key', id::text,
        'type', 'bench.noop.completed',
        'payload', jsonb_build_object('job_id', id, 'tenant', 'bench', 'kind', 'bench.noop', 'queue', 'default', 'state', 'SUCCEEDED', 'state_version', 3, 'attempt', 1, 'error_class', null)) ORDER BY seq)
    FROM ev$$, first, :per_row)
FROM generate_series(0, 100000 - 1, :per_row) AS first \gexec
SELECT outbox_batch_rows.ms(:'t0') AS write_batch_ms, round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'l0') / 100000) AS write_batch_b \gset
VACUUM ANALYZE outbox_batch_rows.outbox, outbox_batch_rows.outbox_batch;
CHECKPOINT;

-- 3. today's relay on the singles: claim :batch (key probe), publish
SELECT pg_current_wal_insert_lsn() AS l0, clock_timestamp() AS t0 \gset
DO $do$
DECLARE ids uuid[]; got int; total int := 0; r record;
BEGIN
  LOOP
    ids := ARRAY[]::uuid[];
    FOR r IN
      WITH claimable AS (
        SELECT o.event_id FROM outbox_batch_rows.outbox o
        WHERE o.published_at IS NULL AND o.next_attempt_at <= now()
          AND (o.claimed_until IS NULL OR o.claimed_until < now())
          AND (o.key IS NULL OR NOT EXISTS (SELECT FROM outbox_batch_rows.outbox p
               WHERE hashtextextended(p.key, 0) = hashtextextended(o.key, 0) AND p.seq < o.seq AND p.published_at IS NULL))
        ORDER BY o.seq LIMIT current_setting('outbox_batch_rows.batch')::int)
      UPDATE outbox_batch_rows.outbox o SET claimed_by = 'relay', claimed_until = now() + interval '30 s', attempts = o.attempts + 1
      WHERE o.event_id = ANY (ARRAY(SELECT event_id FROM claimable))
        AND o.published_at IS NULL
      RETURNING o.event_id, o.aggregate_id, o.topic, o.key, o.event_type, o.payload, o.headers, o.seq, o.created_at, o.attempts
    LOOP ids := ids || r.event_id; END LOOP;
    got := cardinality(ids);
    EXIT WHEN got = 0;
    total := total + got;
    UPDATE outbox_batch_rows.outbox SET published_at = now(), claimed_by = NULL, claimed_until = NULL WHERE event_id = ANY (ids);
  END LOOP;
  RAISE NOTICE 'singles relayed %', total;
END $do$;
SELECT outbox_batch_rows.ms(:'t0') AS relay_single_ms, round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'l0') / 100000) AS relay_single_b \gset
VACUUM outbox_batch_rows.outbox;

-- 4. batch rows: claim rows up to :batch events, each event probed against the singles' key index
SELECT pg_current_wal_insert_lsn() AS l0, clock_timestamp() AS t0 \gset
DO $do$
DECLARE seqs bigint[]; got int; total int := 0; held int := 0; r record;
BEGIN
  LOOP
    seqs := ARRAY[]::bigint[]; got := 0;
    FOR r IN
      WITH rows AS (
        SELECT b.seq FROM (
          SELECT b.seq, sum(b.n) OVER (ORDER BY b.seq) - b.n AS before
          FROM outbox_batch_rows.outbox_batch b
          WHERE b.published_at IS NULL AND (b.claimed_until IS NULL OR b.claimed_until < now())
          ORDER BY b.seq LIMIT current_setting('outbox_batch_rows.batch')::int) b
        WHERE b.before < current_setting('outbox_batch_rows.batch')::int),
      claimed AS (
        UPDATE outbox_batch_rows.outbox_batch b SET claimed_by = 'relay', claimed_until = now() + interval '30 s', attempts = b.attempts + 1
        WHERE b.seq = ANY (ARRAY(SELECT seq FROM rows)) AND b.published_at IS NULL
        RETURNING b.seq, b.events)
      SELECT c.seq AS row_seq, e.ord, (e.ev->>'seq')::bigint AS seq, (e.ev->>'id')::uuid AS event_id,
          (e.ev->>'aggregate_id')::uuid AS aggregate_id, e.ev->>'topic' AS topic, e.ev->>'key' AS key,
          e.ev->>'type' AS event_type, e.ev->'payload' AS payload,
          EXISTS (SELECT FROM outbox_batch_rows.outbox p
                  WHERE hashtextextended(p.key, 0) = hashtextextended(e.ev->>'key', 0)
                    AND p.seq < (e.ev->>'seq')::bigint AND p.published_at IS NULL) AS held
      FROM claimed c, jsonb_array_elements(c.events) WITH ORDINALITY AS e (ev, ord)
    LOOP
      got := got + 1;
      IF r.held THEN held := held + 1; END IF;
      IF r.ord = 1 THEN seqs := seqs || r.row_seq; END IF;
    END LOOP;
    EXIT WHEN got = 0;
    total := total + got;
    UPDATE outbox_batch_rows.outbox_batch SET published_at = now(), claimed_by = NULL, claimed_until = NULL WHERE seq = ANY (seqs);
  END LOOP;
  RAISE NOTICE 'batch events relayed % (held %)', total, held;
END $do$;
SELECT outbox_batch_rows.ms(:'t0') AS relay_batch_ms, round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'l0') / 100000) AS relay_batch_b \gset

SELECT :per_row AS events_per_statement, :batch AS claim,
  :write_single_ms AS write_single_ms, :write_single_b AS write_single_b,
  :write_batch_ms AS write_batch_ms, :write_batch_b AS write_batch_b,
  :relay_single_ms AS relay_single_ms, :relay_single_b AS relay_single_b,
  :relay_batch_ms AS relay_batch_ms, :relay_batch_b AS relay_batch_b;
SET client_min_messages = warning; DROP SCHEMA outbox_batch_rows CASCADE;
