package schedule

import (
	_ "embed"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
)

//go:embed queries.sql
var queriesSQL string

// statements is every statement of queries.sql, with the shape the code
// binds and scans; dbsqltest checks it against the schema.
type statements struct {
	putSchedule, deleteSchedule, pauseSchedule, lockForResume, resumeSchedule, listSchedules string
	dueSchedules, holdLease, lockDue, advanceSchedule                                        string
	leaseFree, acquireLease, renewLease, releaseLease, readLease                             string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Query(&q.putSchedule, "PutSchedule", 17, new(string)).
			Binds("name", new(string), new(int64), "UTC", int64(0), "skip", 1, "t", "k", "", 0, `{}`, "", 0, int64(0), new(time.Time), "code"),
		dbsql.Query(&q.deleteSchedule, "DeleteSchedule", 1, new(string)),
		dbsql.Query(&q.pauseSchedule, "PauseSchedule", 1, new(string)),
		dbsql.Query(&q.lockForResume, "LockForResume", 1, new(*string), new(*int64), new(string), new(int64), new(bool)),
		dbsql.Exec(&q.resumeSchedule, "ResumeSchedule", 2).Binds("name", new(time.Time)),
		dbsql.Query(&q.listSchedules, "ListSchedules", 1, new(row).dest()...).Binds(new(string)),
		dbsql.Query(&q.dueSchedules, "DueSchedules", 2, new(string)).Binds(time.Time{}, []string{}),
		dbsql.Query(&q.holdLease, "HoldLease", 2, new(int64)).Binds("holder", int64(1)),
		dbsql.Query(&q.lockDue, "LockDue", 2, new(dueRow).dest()...).Binds("name", time.Time{}),
		dbsql.Exec(&q.advanceSchedule, "AdvanceSchedule", 5).Binds("name", new(time.Time), new(time.Time), pgtype.UUID{}, time.Time{}),
		dbsql.Query(&q.leaseFree, "LeaseFree", 0, new(bool), new(float64)),
		dbsql.Query(&q.acquireLease, "AcquireLease", 2, new(int64), new(*string)).Binds("holder", int64(1)),
		dbsql.Exec(&q.renewLease, "RenewLease", 3).Binds("holder", int64(1), int64(1)),
		dbsql.Exec(&q.releaseLease, "ReleaseLease", 2).Binds("holder", int64(1)),
		dbsql.Query(&q.readLease, "ReadLease", 0, new(*string), new(int64), new(time.Time)),
	)
}

// specRow is a schedule's spec columns as stored.
type specRow struct {
	cron                *string
	everyMS             *int64
	timeZone            string
	jitterMS            int64
	misfire             string
	catchUpMax          int
	tenant, kind, queue string
	priority            int
	payload             []byte
	groupKey            string
	maxAttempts         int
	estimatedTokens     int64
}

func (r *specRow) dest() []any {
	return []any{&r.cron, &r.everyMS, &r.timeZone, &r.jitterMS, &r.misfire, &r.catchUpMax,
		&r.tenant, &r.kind, &r.queue, &r.priority, &r.payload, &r.groupKey, &r.maxAttempts, &r.estimatedTokens}
}

// dueRow is a LockDue row.
type dueRow struct {
	specRow
	nextSlot time.Time
}

func (r *dueRow) dest() []any { return append(r.specRow.dest(), &r.nextSlot) }

// row is a ListSchedules row.
type row struct {
	name string
	specRow
	paused                             bool
	nextSlot, lastSlot, lastEnqueuedAt *time.Time
	lastJob                            pgtype.UUID
	source                             string
	createdAt, updatedAt               time.Time
}

func (r *row) dest() []any {
	return append(append([]any{&r.name}, r.specRow.dest()...),
		&r.paused, &r.nextSlot, &r.lastSlot, &r.lastJob, &r.lastEnqueuedAt, &r.source, &r.createdAt, &r.updatedAt)
}
