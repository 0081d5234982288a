-- Retention of the outbox (see prune.go). Pruning published events uses
-- the relay's own PrunePublished statement (queries.sql), so a relay and
-- the retention service prune the same rows the same way and never fight:
-- both delete in small batches with SKIP LOCKED.

-- name: CountPublished
-- Events published more than $1 ms ago: what PrunePublished would delete.
-- Served by outbox_published_idx.
SELECT count(*)
FROM /*schema*/outbox
WHERE published_at < now() - $1 * interval '1 millisecond';

-- name: OldestEvents
-- The oldest published and the oldest unpublished event's times (NULL when
-- none), each the first entry of an index: outbox_published_idx, and
-- outbox_pending_idx in write order.
SELECT (SELECT min(published_at) FROM /*schema*/outbox WHERE published_at IS NOT NULL),
       (SELECT created_at FROM /*schema*/outbox WHERE published_at IS NULL ORDER BY seq LIMIT 1);

-- name: PruneUnrelayed
-- For hosts that run no relay: deletes up to $2 unpublished events written
-- more than $1 ms ago, oldest first through outbox_pending_idx, but only
-- while no relay holds the leader lease (a lease in force, or one that
-- lapsed less than $1 ms ago), so events a relay is about to publish are
-- never lost to it. SKIP LOCKED: an event a relay holds is left to it.
DELETE FROM /*schema*/outbox
WHERE event_id IN (
    SELECT event_id
    FROM /*schema*/outbox
    WHERE published_at IS NULL
        AND created_at < now() - $1 * interval '1 millisecond'
        AND NOT EXISTS (
            SELECT FROM /*schema*/outbox_relay_lease
            WHERE holder IS NOT NULL AND lease_until > now() - $1 * interval '1 millisecond')
    ORDER BY seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: RelayLease
-- The relays' leader lease, for operators: who holds it, until when, and
-- how many times it was acquired (0: no relay ever ran on this schema).
SELECT coalesce(holder, ''), nullif(lease_until, '-infinity'), epoch
FROM /*schema*/outbox_relay_lease;
