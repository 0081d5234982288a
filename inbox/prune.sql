-- Retention of the inbox (see prune.go). Pruning runs PruneMessages
-- (queries.sql), the statement Store.Prune runs.

-- name: CountMessages
-- Ids received more than $1 ms ago: what PruneMessages would delete.
-- Served by inbox_received_idx.
SELECT count(*)
FROM /*schema*/inbox
WHERE received_at < now() - $1 * interval '1 millisecond';

-- name: OldestMessage
-- The oldest id's receipt time (NULL when none): the first entry of
-- inbox_received_idx.
SELECT min(received_at) FROM /*schema*/inbox;
