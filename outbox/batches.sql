-- Batch rows: many events in one row of outbox_batches (migration 0021,
-- Store.WriteBatch). Tables are written /*schema*/name.

-- name: InsertBatch
-- One row for the events in the arrays $1..$7 (ids, aggregates, topics,
-- keys, types, payloads and headers as JSON text), each with its own seq
-- from outbox's identity sequence, taken in the arrays' order (the scan of
-- unnest yields them in order, and nothing sorts the rows before nextval
-- runs), so a batch keeps the order its writer gave. The row's events
-- are json text (migration 0022): json_agg appends each event's text,
-- where jsonb_agg decoded and encoded every token again. A payload and
-- headers still pass through jsonb, so an event leaves a batch row in the
-- form a single-event row stores (one value per key, jsonb's spacing),
-- whether it is published from the row or split into outbox's jsonb
-- columns first. (What jsonb cannot store, such as \u0000, WriteBatch
-- refuses before this statement.) A NULL aggregate or key is a JSON null;
-- empty headers, most events' value, are left out. The
-- NOTIFY on channel $8, with the first event's topic, is delivered when the
-- caller's transaction commits; HAVING runs it once. The sequence is
-- looked up once per statement (an InitPlan), not per event: the lookup
-- reads the catalog. Returns the seqs, in the events' order, and the row's
-- creation time.
WITH e AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('/*schema*/outbox', 'seq')::regclass)) AS seq, v.*
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
        AS v (id, aggregate, topic, key, type, payload, headers)
), inserted AS (
    INSERT INTO /*schema*/outbox_batches (first_seq, last_seq, event_count, events)
    SELECT min(e.seq), max(e.seq), count(*), json_agg(
        CASE WHEN e.headers = '{}'
            THEN json_build_object('seq', e.seq, 'id', e.id, 'topic', e.topic, 'type', e.type, 'payload', e.payload::jsonb,
                'aggregate', e.aggregate, 'key', e.key)
            ELSE json_build_object('seq', e.seq, 'id', e.id, 'topic', e.topic, 'type', e.type, 'payload', e.payload::jsonb,
                'aggregate', e.aggregate, 'key', e.key, 'headers', e.headers::jsonb)
        END
        ORDER BY e.seq)
    FROM e
    HAVING pg_notify($8, min(e.topic)) IS NOT NULL
    RETURNING created_at
)
SELECT ARRAY(SELECT seq FROM e ORDER BY seq), created_at
FROM inserted;

-- block: claimed_batch_columns
-- What a claim of batch rows returns of each row: the row, and the seqs of
-- its events that an earlier unpublished single-event row of their key
-- holds back (by the key hash of outbox_pending_key_idx, one index probe
-- per keyed event), which the relay splits out instead of publishing (see
-- Relay.publishBatches). Such a single-event row claimed in the same
-- transaction is still unpublished, and holds its key's events here back
-- too.
RETURNING b.first_seq, b.created_at, b.attempts, b.events, ARRAY(
    SELECT (e ->> 'seq')::bigint
    FROM json_array_elements(b.events) AS e
    -- Keyed events (a key is a string, or null). Written as an equality,
    -- which the planner estimates as selective: with "IS NOT NULL" it
    -- expects every event to be keyed and hashes every unpublished event
    -- row instead of probing outbox_pending_key_idx once per keyed event.
    WHERE json_typeof(e -> 'key') = 'string'
        AND EXISTS (
            SELECT FROM /*schema*/outbox AS p
            WHERE hashtextextended(p.key, 0) = hashtextextended(e ->> 'key', 0)
                AND p.seq < (e ->> 'seq')::bigint
                AND p.published_at IS NULL
        )
)

-- block: claim_batches_set
-- The claim's update of batch rows (see ClaimBatches).
SET claimed_by    = $1,
    claimed_until = now() + $2 * interval '1 millisecond',
    attempts      = b.attempts + 1

-- name: ClaimBatches
-- Claims, for relay $1, for $2 ms, fenced by lease epoch $3 as ClaimEvents
-- is, the unpublished batch rows with the lowest seqs, in order, as long
-- as each is due (not claimed, or its claim expired) and they hold at most
-- $4 events together, the first row whatever its size. Batch rows are
-- published in write order, never past one another: a row claimed by
-- another relay, or by this one's batch in flight, holds the rows after it
-- (see Relay.publishBatches for a row whose claim never settles). So a
-- key's events in two batch rows are published in order without a probe
-- per event.
--
-- The rows are the first entries of outbox_batches_pending_idx: at most
-- $4 of them are read. The running sum and the running "all due so far"
-- make the claimed rows a prefix of them.
--
-- Lock-free, as ClaimEvents: the update waits for a row another session
-- holds (a verdict settling beside this claim, for milliseconds), under
-- the transaction's lock_timeout, and rechecks it; when that passes the
-- relay claims with ClaimBatchSkippingLocked for a while instead.
WITH pending AS (
    SELECT first_seq, event_count, claimed_until
    FROM /*schema*/outbox_batches
    WHERE published_at IS NULL
    ORDER BY first_seq
    LIMIT $4
), prefix AS (
    SELECT first_seq,
        sum(event_count) OVER w AS events_through,
        bool_and(claimed_until IS NULL OR claimed_until < now()) OVER w AS due_through
    FROM pending
    WINDOW w AS (ORDER BY first_seq)
)
UPDATE /*schema*/outbox_batches AS b
/*claim_batches_set*/
WHERE b.first_seq = ANY (ARRAY(
        SELECT first_seq FROM prefix
        WHERE due_through
            AND (events_through <= $4 OR first_seq = (SELECT min(first_seq) FROM pending))))
    AND b.published_at IS NULL
    AND (b.claimed_until IS NULL OR b.claimed_until < now())
    AND ($3 = 0 OR EXISTS (
        SELECT FROM /*schema*/outbox_relay_lease AS l
        WHERE l.holder = $1 AND l.lease_epoch = $3
    ))
/*claimed_batch_columns*/;

-- name: ClaimBatchSkippingLocked
-- ClaimBatches, for the relay's minute of skipping locked rows (see
-- ClaimEventsSkippingLocked): only the first unpublished batch row, locked
-- with SKIP LOCKED. Only the first is a candidate, so skipping it claims
-- nothing rather than a later row, and a row another session holds locked
-- holds every batch row after it. $4 is unused, for the same binding as
-- ClaimBatches. The lock costs one WAL record per batch row, not per
-- event.
WITH first AS (
    SELECT first_seq
    FROM /*schema*/outbox_batches
    WHERE published_at IS NULL
    ORDER BY first_seq
    LIMIT 1
), locked AS (
    SELECT b.first_seq
    FROM /*schema*/outbox_batches AS b
    JOIN first USING (first_seq)
    WHERE b.published_at IS NULL
        AND (b.claimed_until IS NULL OR b.claimed_until < now())
        AND ($3 = 0 OR EXISTS (
            SELECT FROM /*schema*/outbox_relay_lease AS l
            WHERE l.holder = $1 AND l.lease_epoch = $3
        ))
        AND $4::bigint > 0
    FOR UPDATE OF b SKIP LOCKED
)
UPDATE /*schema*/outbox_batches AS b
/*claim_batches_set*/
FROM locked
WHERE b.first_seq = locked.first_seq
/*claimed_batch_columns*/;

-- name: SettleBatch
-- Records the broker's verdict on batch row $1 claimed by relay $2, only
-- while the claim is still this relay's (as MarkPublished): the events
-- whose seqs are in $3 are copied into single-event rows of outbox, with
-- their seq (OVERRIDING SYSTEM VALUE), id, creation time and headers, the
-- error in $4 (empty: not attempted, held back by an earlier event of its
-- key) and a backoff of $5 ms; and the row is marked published with those
-- seqs in split, or deleted when $6 (RelayConfig.DeletePublished). All in
-- one statement, so no crash leaves an event both copied and still
-- publishable from its row.
--
-- A copy keeps the event's id, and outbox's primary key is the id: a copy
-- whose id a stored event already has is not made (ON CONFLICT DO
-- NOTHING), as a consumer deduplicating by id would drop it anyway (event
-- ids identify events; see the package documentation).
--
-- The row is locked with SKIP LOCKED: a row another session holds is left
-- alone, and returned, so the relay keeps the verdict for a later
-- transaction (see MarkPublishedSkippingLocked). The final SELECT reads
-- the statement's snapshot, before the updates: a row claimed by $2 that
-- locked did not lock is one another session holds.
WITH locked AS (
    SELECT first_seq, created_at, events
    FROM /*schema*/outbox_batches
    WHERE first_seq = $1
        AND claimed_by = $2
        AND published_at IS NULL
    FOR UPDATE SKIP LOCKED
), marked AS (
    UPDATE /*schema*/outbox_batches AS b
    SET published_at  = now(),
        claimed_by    = NULL,
        claimed_until = NULL,
        split         = coalesce($3::bigint[], '{}')
    FROM locked
    WHERE b.first_seq = locked.first_seq
        AND NOT $6::boolean
), deleted AS (
    DELETE FROM /*schema*/outbox_batches AS b
    USING locked
    WHERE b.first_seq = locked.first_seq
        AND $6::boolean
), copied AS (
    INSERT INTO /*schema*/outbox (seq, event_id, aggregate_id, topic, key, event_type, payload, headers,
        created_at, attempts, next_attempt_at, last_error)
    OVERRIDING SYSTEM VALUE
    SELECT v.seq, (e ->> 'id')::uuid, (e ->> 'aggregate')::uuid, e ->> 'topic', e ->> 'key', e ->> 'type',
        (e -> 'payload')::jsonb, coalesce((e -> 'headers')::jsonb, '{}'), locked.created_at,
        CASE WHEN v.error = '' THEN 0 ELSE 1 END,
        now() + v.delay_ms * interval '1 millisecond',
        nullif(v.error, '')
    FROM locked
    CROSS JOIN json_array_elements(locked.events) AS e
    JOIN unnest($3::bigint[], $4::text[], $5::bigint[]) AS v (seq, error, delay_ms)
        ON v.seq = (e ->> 'seq')::bigint
    ON CONFLICT (event_id) DO NOTHING
)
SELECT count(*)
FROM /*schema*/outbox_batches
WHERE first_seq = $1
    AND claimed_by = $2
    AND published_at IS NULL
    AND first_seq NOT IN (SELECT first_seq FROM locked);
