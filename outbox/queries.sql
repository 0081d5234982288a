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
-- Events of batch rows are read out of every row (no index either), an
-- event split out of its row once, by its copy (split lists it). A batch
-- event's attempts are its row's.
SELECT event_id, aggregate_id, topic, key, event_type, payload, headers,
    seq, created_at, attempts, published_at, last_error
FROM /*schema*/outbox
WHERE aggregate_id = $1
UNION ALL
SELECT (e ->> 'id')::uuid, (e ->> 'aggregate')::uuid, e ->> 'topic', e ->> 'key', e ->> 'type',
    (e -> 'payload')::jsonb, coalesce((e -> 'headers')::jsonb, '{}'),
    (e ->> 'seq')::bigint, b.created_at, b.attempts, b.published_at, NULL
FROM /*schema*/outbox_batches AS b
CROSS JOIN json_array_elements(b.events) AS e
WHERE e ->> 'aggregate' = $1::text
    AND (e ->> 'seq')::bigint <> ALL (b.split)
ORDER BY seq;

-- name: LockClaims
-- Relays claim one at a time (transaction-scoped advisory lock per schema):
-- the claim's "no earlier event of this key is held elsewhere" check must
-- see every claim committed before it, which concurrent claims would not.
-- Claims are one short statement, so the lock is held for milliseconds.
-- The lock is the claim transaction's first statement, before the verdict
-- it records: a transaction that holds row locks of its verdict never
-- waits for this lock, so a claim waiting for such a row (ClaimEvents
-- takes no row lock first) cannot deadlock with it.
--
-- The claim's commit does not wait for its WAL flush (synchronous_commit
-- off for this transaction only): a claim lost in a database crash only
-- means its events are claimed and published again, which at-least-once
-- delivery allows, and consumers deduplicate. Key order is kept: a key's
-- later event cannot be claimed until its earlier one is marked published,
-- and a mark lost in the same crash is lost with every later commit.
--
-- A relay's claims and verdicts are sent whole, as one batch that the
-- server runs as one implicit transaction to its commit
-- (Relay.transactWith), without waiting for the relay between statements:
-- a relay frozen (SIGSTOP, a VM pause) holds the lock there only while its
-- batch is half sent, or its unread results fill the connection's
-- buffers. The takeover
-- (AcquireLease) sends its statements one after another: a standby frozen
-- between them would hold the lock, and stop every relay and the takeover
-- of the lease, until it resumed. idle_in_transaction_session_timeout ($2
-- ms, half the leader lease) ends such a session instead, which rolls its
-- transaction back and frees the lock in time for another standby to take
-- over within twice the lease.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0)),
    set_config('synchronous_commit', 'off', true),
    set_config('idle_in_transaction_session_timeout', $2::bigint::text, true);

-- block: claimable_events
-- The events a claim may take, in write order (see ClaimEvents).
    SELECT o.event_id
    FROM /*schema*/outbox AS o
    WHERE o.published_at IS NULL
        AND o.seq >= $4
        AND o.seq < $5
        AND o.next_attempt_at <= now()
        AND (o.claimed_until IS NULL OR o.claimed_until < now())
        -- The leader fence: a relay running as the active one ($6, its
        -- lease epoch, > 0) claims only while the lease still names it
        -- with that epoch. Uncorrelated, so it runs once per claim, as a
        -- one-time filter; RelayOnce and Drain pass 0 and claim unfenced.
        AND ($6 = 0 OR EXISTS (
            SELECT FROM /*schema*/outbox_relay_lease AS l
            WHERE l.holder = $2 AND l.lease_epoch = $6
        ))
        -- A keyed event waits for every batch row below it (see
        -- ClaimBatch): a batch row holds events of any key. Uncorrelated,
        -- the first entry of outbox_batches_pending_idx, read once.
        AND (o.key IS NULL OR o.seq < (
            SELECT coalesce(min(b.first_seq), 9223372036854775807)
            FROM /*schema*/outbox_batches AS b
            WHERE b.published_at IS NULL
        ))
        AND (o.key IS NULL OR NOT EXISTS (
            SELECT FROM /*schema*/outbox AS p
            -- By the 64-bit hash outbox_pending_key_idx holds (migration
            -- 0019), answered from the index alone. Two keys sharing a
            -- hash are held back together: an event waits for the other
            -- key's earlier event as for one of its own, which delays it
            -- and never reorders anything.
            WHERE hashtextextended(p.key, 0) = hashtextextended(o.key, 0)
                AND p.seq < o.seq
                AND p.published_at IS NULL
        ))
    ORDER BY o.seq
    LIMIT $1

-- block: claim_events
-- The update that claims them (see ClaimEvents).
UPDATE /*schema*/outbox AS o
SET claimed_by    = $2,
    claimed_until = now() + $3 * interval '1 millisecond',
    attempts      = o.attempts + 1
-- The claimed ids as an array probe the primary key; joining the CTE let the
-- planner hash-join it against a scan of the whole outbox instead.
WHERE o.event_id = ANY (ARRAY(SELECT event_id FROM claimable))
    -- Checked again on the row as a verdict settling beside a lock-free
    -- claim left it (see ClaimEvents): an event it published or backed
    -- off meanwhile is skipped.
    AND o.published_at IS NULL
    AND o.next_attempt_at <= now()
    AND (o.claimed_until IS NULL OR o.claimed_until < now())
RETURNING o.event_id, o.aggregate_id, o.topic, o.key, o.event_type, o.payload, o.headers,
    o.seq, o.created_at, o.attempts

-- name: ClaimEvents
-- Claims up to $1 due, unclaimed (or claim-expired) events in write order
-- for relay $2, for $3 ms, with seq in [$4, $5), fenced by lease epoch $6. The relay passes the lowest
-- seq of its previous full batch while it keeps finding full batches, so
-- each claim does not step again over the index entries of everything
-- published since the last vacuum; it starts from 0 again whenever a batch
-- is not full, and at least once a second, so an event skipped meanwhile
-- (one backing off, or committed late with a low seq) is never left behind.
-- $5 bounds the claims a relay makes while its previous batch is still
-- being published: when that batch holds every key with events waiting,
-- each event in the range is held back by its key, and an unbounded claim
-- would step over the whole backlog to find nothing. Other claims pass the
-- largest bigint.
--
-- Key order: an event with a key is claimed only when it is the oldest
-- unpublished event of its key. So a key has at most one event in flight,
-- in any relay: a refused publication cannot let a later event of its key
-- overtake it (in the same call, or in the next claim while it backs off or
-- sits below the starting seq). outbox_pending_key_idx answers that probe
-- (by a hash of the key, in seq order: the first entry it finds is the
-- key's oldest unpublished event), outbox_pending_idx the order. The cost
-- is one event per key per claim: keys are for ordering, and should be as
-- narrow as the order needed (a job, an invoice), never one key for
-- everything.
--
-- The claim takes no row lock before its update: claims never run at
-- once (LockClaims), and a row lock is a WAL record of its own, 54 bytes
-- an event. What else may write an unpublished event is a verdict
-- committed or settling beside this claim, which the update waits for
-- and then rechecks; or a session of someone else's holding its row (an
-- operator's open transaction), which would hold every claim. So the
-- claim runs under a short lock_timeout, and when that passes the relay
-- claims with ClaimEventsSkippingLocked for a while instead, and records
-- the verdicts in the same transaction with MarkPublishedSkippingLocked
-- and MarkFailedSkippingLocked (see Relay.claim).
WITH claimable AS (
/*claimable_events*/)
/*claim_events*/;

-- name: ClaimEventsSkippingLocked
-- ClaimEvents, skipping the events whose rows another session holds, at
-- the price of a row lock per claimed event.
WITH claimable AS (
/*claimable_events*/    FOR UPDATE SKIP LOCKED
)
/*claim_events*/;

-- name: ClaimLockTimeout
-- How long a statement waits for the row of an event, in ms ($1), for the
-- rest of its transaction: a lock-free claim (ClaimEvents) or verdict
-- (MarkPublished, MarkFailed) for a row another session holds, and every
-- other statement of a relay's transactions, which step over held rows
-- and so should not wait at all. Set after LockClaims, so it never bounds
-- the wait for the claims' lock itself; a verdict's transaction of its own
-- (Relay.settle, outside the claims' lock unless it records batch rows,
-- see Relay.transactWith) sets it first. (Such a transaction is sent whole
-- too, so it needs no idle_in_transaction_session_timeout: see LockClaims.)
SELECT set_config('lock_timeout', $1::bigint::text, true);

-- name: RelaxCommit
-- Before the relay's verdicts (MarkPublished, DeletePublished, MarkFailed
-- and their skipping-locked forms), in their transaction. They commit
-- without waiting for their WAL flush: a verdict lost in a database crash
-- only means its events are published again (see LockClaims). And they
-- plan with sequential scans off, until RestorePlans: a connection keeps a
-- statement's plan until the table's statistics change, and a verdict
-- planned on an outbox of a few rows (a relay that deletes what it
-- publishes, while events trickle in) scans the table, and kept scanning
-- it for every batch while a burst filled it: 20 events one at a time,
-- then 20,000, read 657,000 rows
-- (TestARelayAfterATrickleMeetsABurstThroughItsIndexes). A verdict finds
-- its events by id. The claim that may follow in the same transaction
-- plans as before: planned on an empty table without sequential scans, it
-- walks the pending index for each event's key instead of the key index,
-- which is slower than any scan.
SELECT set_config('synchronous_commit', 'off', true),
    set_config('llmq.enable_seqscan', current_setting('enable_seqscan'), true),
    set_config('enable_seqscan', 'off', true);

-- name: RestorePlans
-- After a transaction's verdicts: the setting RelaxCommit found, back.
SELECT set_config('enable_seqscan', current_setting('llmq.enable_seqscan'), true);

-- name: MarkPublished
-- Records the broker's confirmation of claimed events, only while the claim
-- is still this relay's: if it expired and another relay re-claimed an
-- event, that relay's verdict is the one that counts (the event may then be
-- published twice: delivery is at-least-once). A plain id list, so the
-- primary key is probed once per event; no join to misplan. Lock-free: it
-- waits for a row another session holds, under the transaction's short
-- lock_timeout (ClaimLockTimeout); when that passes, the relay records
-- the verdict with MarkPublishedSkippingLocked instead.
UPDATE /*schema*/outbox
SET published_at  = now(),
    claimed_by    = NULL,
    claimed_until = NULL
WHERE event_id = ANY ($2::uuid[])
    AND claimed_by = $1;

-- name: DeletePublished
-- MarkPublished for RelayConfig.DeletePublished: the confirmed events are
-- deleted instead of marked, under the same claim rule. A delete logs a
-- small record per event and leaves its index entries to vacuum; the
-- update it replaces is never heap-only (published_at is in every outbox
-- index's predicate), so it writes a new version of the whole event and
-- an entry in outbox_published_idx, and leaves the old version to vacuum
-- and the new one to the pruner.
DELETE FROM /*schema*/outbox
WHERE event_id = ANY ($2::uuid[])
    AND claimed_by = $1;

-- block: verdict_locked
-- The rows of a verdict skipping locked rows (see MarkPublishedSkippingLocked):
-- its events still claimed by relay $1, locked unless another session holds them.
locked AS (
    SELECT event_id
    FROM /*schema*/outbox
    WHERE event_id = ANY ($2::uuid[])
        AND claimed_by = $1
    FOR UPDATE SKIP LOCKED
)

-- block: verdict_skipped
-- The events of a verdict skipping locked rows that it could not record:
-- still claimed by relay $1 as of the statement's snapshot, but held by
-- another session.
SELECT event_id
FROM /*schema*/outbox
WHERE event_id = ANY ($2::uuid[])
    AND claimed_by = $1
    AND event_id NOT IN (SELECT event_id FROM locked)

-- name: MarkPublishedSkippingLocked
-- MarkPublished, stepping over the rows another session holds (an
-- operator's open transaction) instead of waiting for them, and returning
-- those events. The relay runs it where MarkPublished waited too long
-- (ClaimLockTimeout), as claims then run ClaimEventsSkippingLocked: a
-- verdict runs in the claims' lock, and waiting there for such a row would
-- stop every relay and the takeover. The relay keeps what it returns and
-- records it in a later transaction, once the row is free (while the
-- relay's claim lasts; if it ran out and another relay re-claimed the
-- event meanwhile, that relay's verdict counts and the event is
-- published again, at-least-once). The row locks cost a WAL record per
-- event, in this mode only. The update finds each row it locked above
-- unchanged, so it waits for nothing.
WITH /*verdict_locked*/, marked AS (
    UPDATE /*schema*/outbox AS o
    SET published_at  = now(),
        claimed_by    = NULL,
        claimed_until = NULL
    FROM locked
    WHERE o.event_id = locked.event_id
)
/*verdict_skipped*/;

-- name: DeletePublishedSkippingLocked
-- DeletePublished as MarkPublishedSkippingLocked is MarkPublished.
WITH /*verdict_locked*/, deleted AS (
    DELETE FROM /*schema*/outbox AS o
    USING locked
    WHERE o.event_id = locked.event_id
)
/*verdict_skipped*/;

-- name: MarkFailed
-- Backs off events the broker did not confirm, by $4 ms each, keeping the
-- error; same claim rule as MarkPublished. Failures are few, so the join
-- with the input is small.
UPDATE /*schema*/outbox AS o
SET last_error      = v.error,
    next_attempt_at = now() + v.delay_ms * interval '1 millisecond',
    claimed_by      = NULL,
    claimed_until   = NULL
FROM unnest($2::uuid[], $3::text[], $4::bigint[]) AS v (event_id, error, delay_ms)
WHERE o.event_id = v.event_id
    AND o.claimed_by = $1;

-- name: MarkFailedSkippingLocked
-- MarkFailed as MarkPublishedSkippingLocked is MarkPublished.
WITH /*verdict_locked*/, failed AS (
    UPDATE /*schema*/outbox AS o
    SET last_error      = v.error,
        next_attempt_at = now() + v.delay_ms * interval '1 millisecond',
        claimed_by      = NULL,
        claimed_until   = NULL
    FROM unnest($2::uuid[], $3::text[], $4::bigint[]) AS v (event_id, error, delay_ms)
    JOIN locked USING (event_id)
    WHERE o.event_id = v.event_id
)
/*verdict_skipped*/;

-- name: LeaseFree
-- A standby's check: whether the leader lease is free (released, or not
-- renewed in time), and else in how many milliseconds it expires unless
-- renewed (by the database's clock, so the relays' clocks do not matter).
-- A read of the one row: no lock, no write, so standbys cost the active
-- relay nothing.
-- (A released lease's lease_until is -infinity, which no interval
-- arithmetic takes, hence the CASE.)
SELECT lease_until < now(),
    CASE WHEN lease_until > now() AND lease_until < 'infinity' THEN extract(epoch FROM lease_until - now()) * 1000 ELSE 0 END::float8
FROM /*schema*/outbox_relay_lease;

-- name: AcquireLease
-- Takes the lease for relay $1, for $2 ms, if it is free, with the next
-- epoch, and returns that epoch and the holder it replaced. Runs after
-- LockClaims, in the claims' transaction-scoped lock: a claim of the
-- previous holder is either committed before (and released below) or made
-- after, and then fenced out by the new epoch, which its statement sees.
-- The row is locked first (FOR UPDATE) so a renewal racing the takeover
-- is waited for and rechecked, never overwritten.
--
-- The previous holder's claims are released in the same statement: the
-- lease passed to another relay because that one stopped renewing it
-- (died, paused, or lost the database), so its batches would otherwise
-- wait out ClaimLease while the new relay publishes around them. If it is
-- only paused and publishes its batch when it resumes, those messages are
-- duplicates of events the new relay published again (at-least-once), and
-- its verdicts count for nothing (MarkPublished and MarkFailed require the
-- claim). It looks at unpublished events only: through outbox_pending_idx
-- when they are few beside the published ones kept for Retention (the
-- steady state), by a scan of the table during a large backlog; either is
-- paid once per takeover.
--
-- SKIP LOCKED: a row another session holds (an operator's open
-- transaction) would otherwise stop the takeover, in the claims' lock,
-- for as long as it is held, and the standby would never become active.
-- Such an event keeps the previous holder's claim, and is claimable again
-- when that runs out (claimed_until, ClaimLease after it was made), like
-- any expired claim, and once the row is free (claims step over held rows
-- meanwhile: see ClaimEvents). The row locks cost a WAL record each, once
-- per takeover. The transaction also sets a short lock_timeout
-- (ClaimLockTimeout) for the lease row, which a renewal holds for
-- milliseconds only.
WITH old AS (
    SELECT holder FROM /*schema*/outbox_relay_lease FOR UPDATE
), acquired AS (
    UPDATE /*schema*/outbox_relay_lease AS l
    SET holder      = $1,
        lease_epoch = l.lease_epoch + 1,
        lease_until = now() + $2 * interval '1 millisecond',
        acquired_at = now()
    FROM old
    WHERE l.lease_until < now()
    RETURNING l.lease_epoch, old.holder AS previous
), releasable AS (
    SELECT p.event_id
    FROM /*schema*/outbox AS p
    WHERE p.published_at IS NULL
        AND p.claimed_by = (SELECT previous FROM acquired)
    FOR UPDATE OF p SKIP LOCKED
), released AS (
    UPDATE /*schema*/outbox AS o
    SET claimed_by = NULL, claimed_until = NULL
    FROM releasable
    WHERE o.event_id = releasable.event_id
    RETURNING 1
), releasable_batches AS (
    SELECT p.first_seq
    FROM /*schema*/outbox_batches AS p
    WHERE p.published_at IS NULL
        AND p.claimed_by = (SELECT previous FROM acquired)
    FOR UPDATE OF p SKIP LOCKED
), released_batches AS (
    UPDATE /*schema*/outbox_batches AS b
    SET claimed_by = NULL, claimed_until = NULL
    FROM releasable_batches
    WHERE b.first_seq = releasable_batches.first_seq
    RETURNING b.event_count
)
SELECT lease_epoch, previous,
    (SELECT count(*) FROM released) + (SELECT coalesce(sum(event_count), 0) FROM released_batches)
FROM acquired;

-- name: ReleaseOwnClaims
-- The claims of relay $1, released by the relay itself when it knows that
-- none of them is in flight: its Run had a pass fail for the connection's
-- or the server's trouble (a restart, a lost connection), and starts the
-- next with nothing being published (see Relay.claim). What it still
-- claims then is a claim whose commit reached the server and whose reply
-- did not, or one whose verdict was lost (the relay keeps a verdict a
-- lost connection failed and records it first, in this transaction, so
-- such a claim is rare). Either would hold its events, the later events
-- of their keys and every batch row after it for ClaimLease, while the
-- relay publishes around them, as a dead relay's claims would (see
-- AcquireLease, which releases those).
--
-- Each claim is undone, its attempt included: the relay knows its
-- publication, if any, returned, and a batch row claimed again is split
-- whole as one whose publication stopped its relay (see
-- Relay.publishBatches), which this one did not. A claim made again
-- publishes its events again, in key order, as after a takeover: each
-- was the oldest unpublished event of its key, or its batch row the first
-- unpublished one.
--
-- Runs in the claims' lock, after the verdicts and before the claims of
-- its transaction, so those see the events free. It reads unpublished
-- rows only: through outbox_pending_idx and outbox_batches_pending_idx
-- when they are few beside the published ones kept for Retention, by a
-- scan of the table during a large backlog; either is paid once per
-- failed pass. SKIP LOCKED, as AcquireLease, for a row another session
-- holds: it keeps the claim, which runs out after ClaimLease.
WITH releasable AS (
    SELECT p.event_id
    FROM /*schema*/outbox AS p
    WHERE p.published_at IS NULL
        AND p.claimed_by = $1
    FOR UPDATE OF p SKIP LOCKED
), released AS (
    UPDATE /*schema*/outbox AS o
    SET claimed_by = NULL, claimed_until = NULL, attempts = greatest(o.attempts - 1, 0)
    FROM releasable
    WHERE o.event_id = releasable.event_id
    RETURNING 1
), releasable_batches AS (
    SELECT p.first_seq
    FROM /*schema*/outbox_batches AS p
    WHERE p.published_at IS NULL
        AND p.claimed_by = $1
    FOR UPDATE OF p SKIP LOCKED
), released_batches AS (
    UPDATE /*schema*/outbox_batches AS b
    SET claimed_by = NULL, claimed_until = NULL, attempts = greatest(b.attempts - 1, 0)
    FROM releasable_batches
    WHERE b.first_seq = releasable_batches.first_seq
    RETURNING b.event_count
)
SELECT (SELECT count(*) FROM released) + (SELECT coalesce(sum(event_count), 0) FROM released_batches);

-- name: RenewLease
-- Extends relay $1's lease of epoch $2 by $3 ms from now. No row: another
-- relay took the lease over, and this one must stop claiming (its claims
-- are fenced already). An expired lease nobody took is still this relay's.
UPDATE /*schema*/outbox_relay_lease
SET lease_until = now() + $3 * interval '1 millisecond'
WHERE holder = $1 AND lease_epoch = $2;

-- name: ReleaseLease
-- A relay stopping hands the lease on at once: it is free from now, for
-- the next standby's check. The holder stays, so that a claim it failed to
-- settle is released by the next acquirer.
UPDATE /*schema*/outbox_relay_lease
SET lease_until = '-infinity'
WHERE holder = $1 AND lease_epoch = $2;

-- name: PendingStats
-- The unpublished backlog: its size and the age of its oldest event, read
-- through outbox_pending_idx and outbox_batches_pending_idx (an
-- unpublished batch row has split none of its events yet).
SELECT (SELECT count(*) FROM /*schema*/outbox WHERE published_at IS NULL)
        + (SELECT coalesce(sum(event_count), 0) FROM /*schema*/outbox_batches WHERE published_at IS NULL),
    coalesce(extract(epoch FROM now() - least(
        (SELECT created_at FROM /*schema*/outbox WHERE published_at IS NULL ORDER BY seq LIMIT 1),
        (SELECT created_at FROM /*schema*/outbox_batches WHERE published_at IS NULL ORDER BY first_seq LIMIT 1))), 0)::float8;

-- name: PrunePublished
-- Deletes up to $2 events and up to $2 batch rows published more than $1
-- ms ago, oldest first, and returns how many events went (a batch row's,
-- less those split out of it, which went or go as their copies) and
-- whether either limit was reached (then there may be more: the event
-- count says nothing of that, a batch row holding any number).
WITH singles AS (
    DELETE FROM /*schema*/outbox
    WHERE event_id IN (
        SELECT event_id
        FROM /*schema*/outbox
        WHERE published_at < now() - $1 * interval '1 millisecond'
        ORDER BY published_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING 1
), batches AS (
    DELETE FROM /*schema*/outbox_batches
    WHERE first_seq IN (
        SELECT first_seq
        FROM /*schema*/outbox_batches
        WHERE published_at < now() - $1 * interval '1 millisecond'
        ORDER BY published_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING event_count - cardinality(split) AS events
)
SELECT (SELECT count(*) FROM singles) + (SELECT coalesce(sum(events), 0) FROM batches),
    (SELECT count(*) FROM singles) >= $2 OR (SELECT count(*) FROM batches) >= $2;
