package outbox

import (
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
)

// statements is every statement of queries.sql and prune.sql, with the
// shape the code binds and scans; dbsqltest checks it against the schema.
type statements struct {
	insertEvent, listByAggregate, lockClaims, claimEvents, relaxCommit, markPublished, markFailed  string
	deletePublished, claimEventsSkippingLocked, claimLockTimeout                                   string
	markPublishedSkippingLocked, deletePublishedSkippingLocked, markFailedSkippingLocked           string
	pendingStats, prunePublished, leaseFree, acquireLease, renewLease, releaseLease                string
	countUnpublishedUpTo, countPublished, oldestEvents, pruneUnrelayed, countUnrelayed, relayLease string
	restorePlans, insertBatch, claimBatches, claimBatchSkippingLocked, settleBatch                 string

	releaseOwnClaims string // by Run, after a pass the connection failed
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL, pruneSQL, batchesSQL},
		dbsql.Query(&q.insertEvent, "InsertEvent", 8, new(int64), new(time.Time)),
		dbsql.Query(&q.insertBatch, "InsertBatch", 8, new([]int64), new(time.Time)).
			Binds([]pgtype.UUID{}, []pgtype.UUID{}, []string{}, []*string{}, []string{}, []string{}, []string{}, ""),
		dbsql.Query(&q.claimBatches, "ClaimBatches", 4, new(claimedBatchRow).dest()...),
		dbsql.Query(&q.claimBatchSkippingLocked, "ClaimBatchSkippingLocked", 4, new(claimedBatchRow).dest()...),
		dbsql.Query(&q.settleBatch, "SettleBatch", 6, new(int64)).
			Binds(int64(0), "relay", []int64{}, []string{}, []int64{}, false),
		dbsql.Query(&q.listByAggregate, "ListEventsByAggregate", 1, new(listedRow).dest()...),
		dbsql.Discard(&q.lockClaims, "LockClaims", 2),
		dbsql.Query(&q.claimEvents, "ClaimEvents", 6, new(claimedRow).dest()...),
		dbsql.Query(&q.claimEventsSkippingLocked, "ClaimEventsSkippingLocked", 6, new(claimedRow).dest()...),
		dbsql.Discard(&q.claimLockTimeout, "ClaimLockTimeout", 1),
		dbsql.Query(&q.markPublishedSkippingLocked, "MarkPublishedSkippingLocked", 2, new([16]byte)).Binds("relay", []pgtype.UUID{}),
		dbsql.Query(&q.deletePublishedSkippingLocked, "DeletePublishedSkippingLocked", 2, new([16]byte)).Binds("relay", []pgtype.UUID{}),
		dbsql.Query(&q.markFailedSkippingLocked, "MarkFailedSkippingLocked", 4, new([16]byte)).Binds("relay", []pgtype.UUID{}, []string{}, []int64{}),
		dbsql.Discard(&q.relaxCommit, "RelaxCommit", 0),
		dbsql.Discard(&q.restorePlans, "RestorePlans", 0),
		dbsql.Exec(&q.markPublished, "MarkPublished", 2),
		dbsql.Exec(&q.deletePublished, "DeletePublished", 2),
		dbsql.Exec(&q.markFailed, "MarkFailed", 4),
		dbsql.Query(&q.pendingStats, "PendingStats", 0, new(int64), new(float64)),
		dbsql.Query(&q.prunePublished, "PrunePublished", 2, new(int64), new(bool)),
		dbsql.Query(&q.leaseFree, "LeaseFree", 0, new(bool), new(float64)),
		dbsql.Query(&q.acquireLease, "AcquireLease", 2, new(int64), new(*string), new(int64)),
		dbsql.Query(&q.releaseOwnClaims, "ReleaseOwnClaims", 1, new(int64)),
		dbsql.Exec(&q.renewLease, "RenewLease", 3),
		dbsql.Exec(&q.releaseLease, "ReleaseLease", 2),
		dbsql.Query(&q.countUnpublishedUpTo, "CountUnpublishedUpTo", 1, new(int64), new(float64)),
		dbsql.Query(&q.countPublished, "CountPublished", 1, new(int64)),
		dbsql.Query(&q.oldestEvents, "OldestEvents", 0, new(*time.Time), new(*time.Time)),
		dbsql.Query(&q.pruneUnrelayed, "PruneUnrelayed", 2, new(int64), new(bool)),
		dbsql.Query(&q.countUnrelayed, "CountUnrelayed", 1, new(int64)),
		dbsql.Query(&q.relayLease, "RelayLease", 0, new(string), new(*time.Time), new(int64)),
	)
}

// claimedRow is a ClaimEvents row as the relay scans it.
type claimedRow struct {
	r         Record
	aggregate *uuid.UUID
	key       *string
	headers   []byte
}

func (c *claimedRow) dest() []any {
	return []any{(*[16]byte)(&c.r.ID), &c.aggregate, &c.r.Topic, &c.key, &c.r.Type, dbsql.RawJSON(&c.r.Payload), &c.headers,
		&c.r.Seq, &c.r.CreatedAt, &c.r.Attempts}
}

// listedRow is a ListEventsByAggregate row as scanned.
type listedRow struct {
	r                Record
	aggregate        *uuid.UUID
	key, lastError   *string
	payload, headers []byte
	publishedAt      *time.Time
}

func (l *listedRow) dest() []any {
	return []any{&l.r.ID, &l.aggregate, &l.r.Topic, &l.key, &l.r.Type, &l.payload, &l.headers,
		&l.r.Seq, &l.r.CreatedAt, &l.r.Attempts, &l.publishedAt, &l.lastError}
}

// claimedBatchRow is a ClaimBatches row as the relay scans it.
type claimedBatchRow struct {
	firstSeq  int64
	createdAt time.Time
	attempts  int
	events    []byte
	held      []int64 // seqs an earlier single-event row of their key holds back
}

func (c *claimedBatchRow) dest() []any {
	return []any{&c.firstSeq, &c.createdAt, &c.attempts, &c.events, &c.held}
}
