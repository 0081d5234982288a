-- Queries of the inbox. Tables are written /*schema*/name.

-- name: InsertMessage
-- Records a new message. ON CONFLICT DO NOTHING waits for a concurrent
-- transaction inserting the same id and then yields to it, so of any number
-- of racing deliveries exactly one is recorded; the others read the winner
-- with SelectMessage once it committed.
INSERT INTO /*schema*/inbox (consumer, message_id, payload_digest, source)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING true;

-- name: SelectMessage
SELECT payload_digest, status
FROM /*schema*/inbox
WHERE consumer = $1 AND message_id = $2;

-- name: InsertMessages
-- Records a batch of messages for consumer $1 ($2 ids, $3 digests, $4
-- sources as JSON text, arrays of one length) and returns the ids it
-- recorded. Inserting in id order makes concurrent batches with common ids
-- wait for each other rather than deadlock; an id given twice is recorded
-- once.
INSERT INTO /*schema*/inbox (consumer, message_id, payload_digest, source)
SELECT $1, m.message_id, m.payload_digest, m.source::jsonb
FROM unnest($2::text[], $3::text[], $4::text[]) AS m(message_id, payload_digest, source)
ORDER BY m.message_id
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id;

-- name: SelectMessages
SELECT message_id, payload_digest
FROM /*schema*/inbox
WHERE consumer = $1 AND message_id = ANY($2::text[]);

-- name: InsertQuarantine
-- $2 and $5 are what text and jsonb can show of the id and headers; $8 to
-- $10 keep them exactly. A NULL $6 is a null body.
INSERT INTO /*schema*/inbox_quarantine (consumer, message_id, payload_digest, source, headers, payload, reason,
                                        raw_message_id, raw_header_keys, raw_header_values)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING id;

-- name: ListQuarantine
-- The primary key gives the order; consumer is filtered, not indexed:
-- quarantine rows are few and read by people.
SELECT id, consumer, message_id, payload_digest, source, headers, payload, reason, received_at,
       raw_message_id, raw_header_keys, raw_header_values
FROM /*schema*/inbox_quarantine
WHERE consumer = $1
ORDER BY id
LIMIT $2;

-- name: PruneMessages
-- Deletes up to $2 rows received more than $1 ms ago (the database's clock),
-- oldest first via inbox_received_idx; SKIP LOCKED lets several pruners
-- share the work.
DELETE FROM /*schema*/inbox
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id
    FROM /*schema*/inbox
    WHERE received_at < now() - $1 * interval '1 millisecond'
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);
