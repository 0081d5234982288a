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

-- name: PruneQuarantine
-- Deletes up to $2 quarantined messages received more than $1 ms ago,
-- oldest first. Walked in id order (the primary key): ids are assigned in
-- order of arrival, so received_at grows with id, the due rows are at the
-- start of the index, and the walk stops after $2 of them without an index
-- of its own (quarantine is rare; an index would cost every quarantined
-- message a write for a table that stays small). SKIP LOCKED: a row being
-- read for replay by a person's tool is left for the next pass.
DELETE FROM /*schema*/inbox_quarantine
WHERE id IN (
    SELECT id
    FROM /*schema*/inbox_quarantine
    WHERE received_at < now() - $1 * interval '1 millisecond'
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: CountQuarantine
-- Quarantined messages received more than $1 ms ago: what PruneQuarantine
-- would delete. A scan of inbox_quarantine (small: rare messages only).
SELECT count(*)
FROM /*schema*/inbox_quarantine
WHERE received_at < now() - $1 * interval '1 millisecond';

-- name: OldestQuarantine
-- The oldest quarantined message's receipt time (NULL when none): the
-- first entry of the primary key, ids growing with arrival.
SELECT received_at FROM /*schema*/inbox_quarantine ORDER BY id LIMIT 1;
