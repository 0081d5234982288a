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
