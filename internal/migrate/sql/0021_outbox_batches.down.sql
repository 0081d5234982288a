-- Events still waiting in batch rows are copied into single-event rows
-- first, each with its own seq, id and creation time, so going back loses
-- nothing unpublished (published batch rows are history, and go).
INSERT INTO /*schema*/outbox (seq, event_id, aggregate_id, topic, key, event_type, payload, headers, created_at)
OVERRIDING SYSTEM VALUE
SELECT (e ->> 'seq')::bigint, (e ->> 'id')::uuid, (e ->> 'aggregate')::uuid, e ->> 'topic', e ->> 'key',
    e ->> 'type', e -> 'payload', coalesce(e -> 'headers', '{}'), b.created_at
FROM /*schema*/outbox_batches AS b, jsonb_array_elements(b.events) AS e
WHERE b.published_at IS NULL
    AND (e ->> 'seq')::bigint <> ALL (b.split)
ON CONFLICT (event_id) DO NOTHING;
DROP TABLE /*schema*/outbox_batches;
ALTER TABLE /*schema*/outbox_relay_lease RENAME COLUMN lease_epoch TO epoch;
