-- Retention of the outbox (see prune.go). Pruning published events uses
-- the relay's own PrunePublished statement (queries.sql), so a relay and
-- the retention service prune the same rows the same way and never fight:
-- both delete in small batches with SKIP LOCKED.

-- name: CountPublished
-- Events published more than $1 ms ago: what PrunePublished would delete.
-- Served by outbox_published_idx.
SELECT (SELECT count(*)
        FROM /*schema*/outbox
        WHERE published_at < now() - $1 * interval '1 millisecond')
    + (SELECT coalesce(sum(event_count - cardinality(split)), 0)
        FROM /*schema*/outbox_batches
        WHERE published_at < now() - $1 * interval '1 millisecond');

-- name: CountUnrelayed
-- What PruneUnrelayed would delete with no limit: unpublished events
-- written more than $1 ms ago, none on a schema where a relay has ever
-- held the leader lease.
SELECT ((SELECT count(*)
            FROM /*schema*/outbox
            WHERE published_at IS NULL
                AND created_at < now() - $1 * interval '1 millisecond')
        + (SELECT coalesce(sum(event_count), 0)
            FROM /*schema*/outbox_batches
            WHERE published_at IS NULL
                AND created_at < now() - $1 * interval '1 millisecond'))
    * (NOT EXISTS (SELECT FROM /*schema*/outbox_relay_lease WHERE lease_epoch > 0 OR holder IS NOT NULL))::int;

-- name: OldestEvents
-- The oldest published and the oldest unpublished event's times (NULL when
-- none), each the first entry of an index: outbox_published_idx, and
-- outbox_pending_idx in write order, and the same of outbox_batches through
-- its two partial indexes (least ignores a NULL).
SELECT least((SELECT min(published_at) FROM /*schema*/outbox WHERE published_at IS NOT NULL),
             (SELECT min(published_at) FROM /*schema*/outbox_batches WHERE published_at IS NOT NULL)),
       least((SELECT created_at FROM /*schema*/outbox WHERE published_at IS NULL ORDER BY seq LIMIT 1),
             (SELECT created_at FROM /*schema*/outbox_batches WHERE published_at IS NULL ORDER BY first_seq LIMIT 1));

-- name: PruneUnrelayed
-- For hosts that run no relay: deletes up to $2 unpublished events written
-- more than $1 ms ago, oldest first through outbox_pending_idx, but only
-- on a schema where no relay has ever held the leader lease (epoch 0, no
-- holder). Once one has, unpublished events are a relay's work: a relay
-- that stopped cleanly leaves lease_until at -infinity and so no time to
-- tell "lately" from "long ago", and one restarting must find its events.
-- The lease row is read FOR SHARE (MATERIALIZED, so the row is read and
-- locked whatever the planner does with the CTE): a relay's first
-- AcquireLease (FOR UPDATE) waits for this delete to commit, and then
-- sees what is left. SKIP LOCKED: an event someone holds is left alone.
-- Batch rows go the same way, up to $2 of them; the statement returns the
-- events deleted and whether either limit was reached (as PrunePublished).
WITH lease AS MATERIALIZED (
    SELECT lease_epoch, holder FROM /*schema*/outbox_relay_lease FOR SHARE
), singles AS (
    DELETE FROM /*schema*/outbox
    WHERE event_id IN (
        SELECT event_id
        FROM /*schema*/outbox
        WHERE published_at IS NULL
            AND created_at < now() - $1 * interval '1 millisecond'
            AND NOT EXISTS (SELECT FROM lease WHERE lease_epoch > 0 OR holder IS NOT NULL)
        ORDER BY seq
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
), batches AS (
    DELETE FROM /*schema*/outbox_batches
    WHERE first_seq IN (
        SELECT first_seq
        FROM /*schema*/outbox_batches
        WHERE published_at IS NULL
            AND created_at < now() - $1 * interval '1 millisecond'
            AND NOT EXISTS (SELECT FROM lease WHERE lease_epoch > 0 OR holder IS NOT NULL)
        ORDER BY first_seq
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING event_count
)
SELECT (SELECT count(*) FROM singles) + (SELECT coalesce(sum(event_count), 0) FROM batches),
    (SELECT count(*) FROM singles) >= $2 OR (SELECT count(*) FROM batches) >= $2;

-- name: RelayLease
-- The relays' leader lease, for operators: who holds it, until when, and
-- how many times it was acquired (0: no relay ever ran on this schema).
SELECT coalesce(holder, ''), nullif(lease_until, '-infinity'), lease_epoch
FROM /*schema*/outbox_relay_lease;

-- name: CountUnpublishedUpTo
-- The unpublished backlog, counted no further than $1 entries of
-- outbox_pending_idx, and its oldest event's age: for llmq stats, whose
-- cost must stay bounded on a host that runs no relay, where the backlog
-- is history that only grows.
-- Batch rows count their events, reading no more than $1 rows of
-- outbox_batches_pending_idx.
SELECT (SELECT count(*) FROM (
            SELECT FROM /*schema*/outbox WHERE published_at IS NULL LIMIT $1) AS s)
        + (SELECT coalesce(sum(event_count), 0) FROM (
            SELECT event_count FROM /*schema*/outbox_batches WHERE published_at IS NULL LIMIT $1) AS b),
    coalesce(extract(epoch FROM now() - least(
        (SELECT created_at FROM /*schema*/outbox WHERE published_at IS NULL ORDER BY seq LIMIT 1),
        (SELECT created_at FROM /*schema*/outbox_batches WHERE published_at IS NULL ORDER BY first_seq LIMIT 1))), 0)::float8;
