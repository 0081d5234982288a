-- The relay's key-order probe ("an earlier unpublished event of the same
-- key?", see ClaimEvents) reads outbox_pending_key_idx. It indexed the key
-- itself, the text of a job's id for every job event (37 bytes), so each
-- event's entry, and its WAL record, carried it; and entries that wide
-- filled and split the index's pages sooner. It now indexes a 64-bit hash
-- of the key, with seq as before, and the probe is still answered from the
-- index alone. Two keys sharing a hash (about one pair in 2^64) are held
-- back together: an event waits for the other key's earlier event as for
-- one of its own, which delays it and never reorders anything.
--
-- hashtextextended is PostgreSQL's own text hash, the one hash partitioning
-- stores its partitions by, so its values stay the same across releases
-- and pg_upgrade.
--
-- Measured with llmq bench -mode drain -jobs 50000 -workers 2000 (all of
-- the server's WAL, bytes per job, PostgreSQL 15): insert 1,179 -> 1,158,
-- drain 1,713-1,720 -> 1,641-1,643, the whole run 2,896-2,902 ->
-- 2,802-2,804; BenchmarkEventWAL's write of an event 694 -> 635-637.
--
-- Built inside the migration's transaction (not CONCURRENTLY): the build
-- reads the whole outbox and blocks writes to it (enqueues among them)
-- until it commits; on a large outbox, migrate at a quiet time.
DROP INDEX /*schema*/outbox_pending_key_idx;
CREATE INDEX outbox_pending_key_idx ON /*schema*/outbox ((hashtextextended(key, 0)), seq)
    WHERE published_at IS NULL AND key IS NOT NULL;
