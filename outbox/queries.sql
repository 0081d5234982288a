-- Queries of the outbox store. Tables are written /*schema*/name.

-- name: InsertEvent
-- One event; the NOTIFY is delivered when the caller's transaction commits
-- (pg_notify returns void, which IS NOT NULL, so the WHERE runs it once).
INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload, headers)
SELECT $1, $2, $3, $4, $5, $6::jsonb, $7::jsonb
WHERE pg_notify($8, $3) IS NOT NULL
RETURNING seq, created_at;

-- name: ListEventsByAggregate
-- An aggregate's events in write order, for inspection. There is
-- deliberately no index on aggregate_id: every index costs each event write,
-- and the table only holds events until they are published and pruned, so
-- this scan is bounded by the unpublished backlog plus the retention window.
SELECT event_id, aggregate_id, topic, key, event_type, payload, headers,
    seq, created_at, attempts, published_at, last_error
FROM /*schema*/outbox
WHERE aggregate_id = $1
ORDER BY seq;

-- name: LockClaims
-- Relays claim one at a time (transaction-scoped advisory lock per schema):
-- the claim's "no earlier event of this key is held elsewhere" check must
-- see every claim committed before it, which concurrent claims would not.
-- Claims are one short statement, so the lock is held for milliseconds.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- name: ClaimEvents
-- Claims up to $1 due, unclaimed (or claim-expired) events in write order
-- for relay $2, for $3 ms. An event is left alone while an earlier
-- unpublished event of its key is held by another relay or backing off, so
-- events sharing a key are published in order even with several relays;
-- outbox_pending_key_idx answers that probe, outbox_pending_idx the order.
WITH claimable AS (
    SELECT o.event_id
    FROM /*schema*/outbox AS o
    WHERE o.published_at IS NULL
        AND o.next_attempt_at <= now()
        AND (o.claimed_until IS NULL OR o.claimed_until < now())
        AND (o.key IS NULL OR NOT EXISTS (
            SELECT FROM /*schema*/outbox AS p
            WHERE p.key = o.key
                AND p.seq < o.seq
                AND p.published_at IS NULL
                AND (p.next_attempt_at > now() OR p.claimed_until >= now())
        ))
    ORDER BY o.seq
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE /*schema*/outbox AS o
SET claimed_by    = $2,
    claimed_until = now() + $3 * interval '1 millisecond',
    attempts      = o.attempts + 1
FROM claimable
WHERE o.event_id = claimable.event_id
RETURNING o.event_id, o.aggregate_id, o.topic, o.key, o.event_type, o.payload, o.headers,
    o.seq, o.created_at, o.attempts;

-- name: SettleEvents
-- Records the broker's verdict on a claimed batch: published events get
-- published_at; failed ones back off by $5 ms each and keep their error.
-- Only while the claim is still this relay's: if it expired and another
-- relay re-claimed the event, that relay's verdict is the one that counts
-- (the event may then be published twice: delivery is at-least-once).
UPDATE /*schema*/outbox AS o
SET published_at    = CASE WHEN v.ok THEN now() END,
    last_error      = CASE WHEN v.ok THEN o.last_error ELSE v.error END,
    next_attempt_at = CASE WHEN v.ok THEN o.next_attempt_at ELSE now() + v.delay_ms * interval '1 millisecond' END,
    claimed_by      = NULL,
    claimed_until   = NULL
FROM unnest($2::uuid[], $3::boolean[], $4::text[], $5::bigint[]) AS v (event_id, ok, error, delay_ms)
WHERE o.event_id = v.event_id
    AND o.claimed_by = $1
    AND o.published_at IS NULL;

-- name: PendingStats
-- The unpublished backlog: its size and the age of its oldest event, read
-- through outbox_pending_idx.
SELECT count(*),
    coalesce(extract(epoch FROM now() - (
        SELECT created_at FROM /*schema*/outbox WHERE published_at IS NULL ORDER BY seq LIMIT 1)), 0)::float8
FROM /*schema*/outbox
WHERE published_at IS NULL;

-- name: PrunePublished
-- Deletes up to $2 events published more than $1 ms ago, oldest first.
DELETE FROM /*schema*/outbox
WHERE event_id IN (
    SELECT event_id
    FROM /*schema*/outbox
    WHERE published_at < now() - $1 * interval '1 millisecond'
    ORDER BY published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);
