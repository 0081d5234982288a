-- Rows of many events (outbox.Store.WriteBatch): one row holds every event
-- one statement writes, so a transaction that writes hundreds of events
-- writes one row, one entry per index, and the relay claims and publishes
-- them with one row update instead of one per event. An event's WAL falls
-- from about 650 bytes to about 110 when a row holds tens of events, and
-- relaying it from about 1,150 to a few (docs/performance.md, "batch rows
-- that split on failure").
--
-- Each event keeps its own seq, from outbox's identity sequence, so events
-- of both tables share one write order, and its own id. A batch row is
-- published whole: an event the broker refused, or one an earlier
-- unpublished single-event row of its key holds back, is copied into a
-- single-event row of outbox that keeps its seq, id, creation time and
-- headers, and is retried from there (split), in the transaction that
-- marks the batch row published. split lists those events' seqs, so
-- readers count each event once.
--
-- first_seq, the lowest seq of the row's events, is the row's identity and
-- the relay's order: the relay claims batch rows in that order (see
-- outbox/batches.sql, ClaimBatches). last_seq, the highest, is for readers
-- that follow the outbox by seq (a change feed, such as the invoice
-- example's event stream): rows written at once may interleave their
-- seqs, so a row below a cursor can hold events above it.
--
-- Fill factor 50, as outbox: the claim's and the publication's updates find
-- room on the row's page and stay heap-only (no indexed column changes
-- except published_at, whose partial indexes take the row out of one and
-- into the other). events above about 2 KB is compressed and stored out of
-- line, so those updates copy a pointer, not the events.
CREATE TABLE /*schema*/outbox_batches (
    first_seq     bigint      PRIMARY KEY,
    last_seq      bigint      NOT NULL CHECK (last_seq >= first_seq),
    created_at    timestamptz NOT NULL DEFAULT now(),
    event_count   integer     NOT NULL CHECK (event_count > 0),
    events        jsonb       NOT NULL,  -- [{seq, id, aggregate, topic, key, type, payload, headers}], in seq order
    attempts      integer     NOT NULL DEFAULT 0,
    claimed_by    text,
    claimed_until timestamptz,
    published_at  timestamptz,
    split         bigint[]    NOT NULL DEFAULT '{}'
) WITH (fillfactor = 50);

-- The relay's work list, in write order: its first entry is the batch row
-- a claim may take, and the bound every keyed single-event row's claim
-- compares its seq with.
CREATE INDEX outbox_batches_pending_idx ON /*schema*/outbox_batches (first_seq)
    WHERE published_at IS NULL;

-- The pruner's, oldest publication first.
CREATE INDEX outbox_batches_published_idx ON /*schema*/outbox_batches (published_at)
    WHERE published_at IS NOT NULL;

-- Readers by seq find the rows holding events above a cursor.
CREATE INDEX outbox_batches_last_seq_idx ON /*schema*/outbox_batches (last_seq);

-- The console's job page finds a job's events in batch rows written in the
-- job's lifetime (batch rows are not indexed by aggregate, any more than
-- outbox rows are): one entry per batch row, not per event.
CREATE INDEX outbox_batches_created_idx ON /*schema*/outbox_batches (created_at);

-- A relay of a build from before this migration knows nothing of batch
-- rows: during a rolling upgrade it would publish a key's later
-- single-event row before the key's earlier event waiting in a batch row.
-- Renaming the lease's epoch makes every statement of such a relay fail
-- (its claims, which read the epoch as their fence, and its attempts to
-- take or renew the lease), so only relays of this build publish from
-- here on; the older ones log their errors until they are replaced. Events
-- wait meanwhile; none is lost or reordered.
ALTER TABLE /*schema*/outbox_relay_lease RENAME COLUMN epoch TO lease_epoch;
