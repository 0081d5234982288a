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

-- name: InsertQuarantine
INSERT INTO /*schema*/inbox_quarantine (consumer, message_id, payload_digest, source, headers, payload, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id;

-- name: ListQuarantine
SELECT id, consumer, message_id, payload_digest, source, headers, payload, reason, received_at
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
