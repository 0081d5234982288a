package providerbatch

import (
	"context"
	_ "embed"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

//go:embed queries.sql
var queriesSQL string

// statements is every statement of queries.sql, with the shape the code
// binds and scans; dbsqltest checks it against the schema.
type statements struct {
	takeLease, releaseLease, holdLease                            string
	insertSubmission, insertItems, markSubmitted, openSubmissions string
	recordPoll, submissionItems, waitingJobs, settleItems         string
	pollItems, knownProviderBatches, unbilledItems, billItems     string
	countSettled, endSubmission, requestCancel, listSubmissions   string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Query(&q.takeLease, "TakeLease", 3, new(int64)).Binds("pool", "holder", int64(0)),
		dbsql.Exec(&q.releaseLease, "ReleaseLease", 3).Binds("pool", "holder", int64(0)),
		dbsql.Query(&q.holdLease, "HoldLease", 3, new(int64)).Binds("pool", "holder", int64(0)),
		dbsql.Exec(&q.insertSubmission, "InsertSubmission", 8).
			Binds(pgtype.UUID{}, "pool", "openai", "model", "queue", int32(0), int64(0), int64(0)),
		dbsql.Exec(&q.insertItems, "InsertItems", 6).
			Binds(pgtype.UUID{}, []pgtype.UUID{}, []string{}, []string{}, []int64{}, []int32{}),
		dbsql.Exec(&q.markSubmitted, "MarkSubmitted", 4).Binds(pgtype.UUID{}, "batch", "status", int64(0)),
		dbsql.Query(&q.openSubmissions, "OpenSubmissions", 1, new(openRow).dest()...).Binds("pool"),
		dbsql.Exec(&q.recordPoll, "RecordPoll", 4).Binds(pgtype.UUID{}, new(string), int64(0), new(string)),
		dbsql.Query(&q.submissionItems, "SubmissionItems", 1, new(itemRow).dest()...).Binds(pgtype.UUID{}),
		dbsql.Query(&q.waitingJobs, "WaitingJobs", 1, new(jobRow).dest()...).Binds([]pgtype.UUID{}),
		dbsql.Query(&q.pollItems, "PollItems", 2, new(pollRow).dest()...).Binds(pgtype.UUID{}, int64(0)),
		dbsql.Query(&q.knownProviderBatches, "KnownProviderBatches", 2, new(string)).Binds("", time.Time{}),
		dbsql.Query(&q.unbilledItems, "UnbilledItems", 1, new([16]byte)).Binds(pgtype.UUID{}),
		dbsql.Query(&q.billItems, "BillItems", 2, new([16]byte), new(string), new(string)).Binds(pgtype.UUID{}, []pgtype.UUID{}),
		dbsql.Query(&q.settleItems, "SettleItems", 3, new([16]byte)).Binds(pgtype.UUID{}, []pgtype.UUID{}, []string{}),
		dbsql.Exec(&q.countSettled, "CountSettled", 6).Binds(pgtype.UUID{}, int32(0), int32(0), int32(0), int32(0), int32(0)),
		dbsql.Exec(&q.endSubmission, "EndSubmission", 2).Binds(pgtype.UUID{}, new(string)),
		dbsql.Query(&q.requestCancel, "RequestCancel", 1, new(string)).Binds(pgtype.UUID{}),
		dbsql.Query(&q.listSubmissions, "ListSubmissions", 2, new(submissionRow).dest()...).Binds("", int32(0)),
	)
}

// openRow is an OpenSubmissions row.
type openRow struct {
	id              [16]byte
	state           string
	model, queue    string
	providerBatchID string
	requests        int32
	estimatedTokens int64
	cancelRequested bool
	polls           int32
	createdAt       time.Time
	nextPollAt      time.Time
}

func (r *openRow) dest() []any {
	return []any{&r.id, &r.state, &r.model, &r.queue, &r.providerBatchID, &r.requests, &r.estimatedTokens,
		&r.cancelRequested, &r.polls, &r.createdAt, &r.nextPollAt}
}

// itemRow is a SubmissionItems row.
type itemRow struct {
	jobID   [16]byte
	tenant  string
	kind    string
	fence   int64
	attempt int32
}

func (r *itemRow) dest() []any { return []any{&r.jobID, &r.tenant, &r.kind, &r.fence, &r.attempt} }

// jobRow is a WaitingJobs row.
type jobRow struct {
	id      [16]byte
	tenant  string
	kind    string
	payload json.RawMessage
	attempt int32
	fence   int64
	state   string
	cancel  bool // a client asked to cancel it
}

func (r *jobRow) dest() []any {
	return []any{&r.id, &r.tenant, &r.kind, dbsql.RawJSON(&r.payload), &r.attempt, &r.fence, &r.state, &r.cancel}
}

// pollRow is a PollItems row.
type pollRow struct {
	item           itemRow
	current        bool // the job still waits on the submission
	cancel         bool // a client asked to cancel it
	leaseRunsShort bool // its lease must be renewed
}

func (r *pollRow) dest() []any {
	return append(r.item.dest(), &r.current, &r.cancel, &r.leaseRunsShort)
}

// row is a row type that names its scan destinations (dest).
type row[T any] interface {
	*T
	dest() []any
}

// query runs sql on db and scans every row into a T.
func query[T any, P row[T]](ctx context.Context, db jobs.DBTX, sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) {
		var v T
		err := r.Scan(P(&v).dest()...)
		return v, err
	})
}
