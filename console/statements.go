package console

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

// statements is every statement of queries.sql, with the shape the code
// binds and scans; dbsqltest checks it against the schema.
type statements struct {
	listJobs, listTenantJobs, listFinished, replayAncestors, replayChildren string // job summaries
	listScanEnd, listTenantScanEnd, finishedScanEnd                         string
	queues, tenantQueues, queueCounts, queueCountsTenant                    string
	finishedPerMinute, finishedPerMinuteTenant, outboxLag                   string
	runners, permitHolders, serviceLeases, tenantRows, jobEvents            string
	usageByDay, usageByDayTenant                                            string
	reuseInvalidations, reuseInvalidation                                   string
	replayedOf, terminalCount, tenantWindowEnd                              string
	failureRate, failureRateTenant                                          string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	summary := new(summaryRow).dest()
	queueCount := new(queueCountRow).dest()
	minute := []any{new(time.Time), new(string), new(int64)}
	usage := usageDest(new(usageDay))
	invalidation := new(invalidationRow).dest()
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Query(&q.listJobs, "ListJobs", 7, summary...),
		dbsql.Query(&q.listTenantJobs, "ListTenantJobs", 8, summary...),
		dbsql.Query(&q.listFinished, "ListFinished", 9, summary...),
		dbsql.Query(&q.replayAncestors, "ReplayAncestors", 2, summary...),
		dbsql.Query(&q.replayChildren, "ReplayChildren", 2, summary...),
		dbsql.Query(&q.listScanEnd, "ListScanEnd", 3, new([16]byte)),
		dbsql.Query(&q.listTenantScanEnd, "ListTenantScanEnd", 4, new([16]byte)),
		dbsql.Query(&q.finishedScanEnd, "FinishedScanEnd", 5, new(time.Time), new([16]byte)),
		dbsql.Query(&q.queues, "Queues", 0, new(string)),
		dbsql.Query(&q.tenantQueues, "TenantQueues", 1, new(string)),
		dbsql.Query(&q.queueCounts, "QueueCounts", 2, queueCount...),
		dbsql.Query(&q.queueCountsTenant, "QueueCountsTenant", 3, queueCount...),
		dbsql.Query(&q.finishedPerMinute, "FinishedPerMinute", 2, minute...),
		dbsql.Query(&q.finishedPerMinuteTenant, "FinishedPerMinuteTenant", 4, minute...),
		dbsql.Query(&q.outboxLag, "OutboxLag", 1, new(int64), new(float64)),
		dbsql.Query(&q.runners, "Runners", 1, new(runnerRow).dest()...),
		dbsql.Query(&q.permitHolders, "PermitHolders", 0, permitHolderDest(new(permitHolder))...),
		dbsql.Query(&q.serviceLeases, "ServiceLeases", 0, new(serviceLeaseRow).dest()...),
		dbsql.Query(&q.tenantRows, "TenantRows", 9, new(tenantRowScan).dest()...),
		dbsql.Query(&q.tenantWindowEnd, "TenantWindowEnd", 4, new(string), new(string)),
		dbsql.Query(&q.jobEvents, "JobEvents", 7, new(eventRow).dest()...),
		dbsql.Query(&q.usageByDay, "UsageByDay", 4, usage...),
		dbsql.Query(&q.replayedOf, "ReplayedOf", 2, new(pgtype.UUID)),
		dbsql.Query(&q.terminalCount, "TerminalCount", 3, new(int64), new(int64)),
		dbsql.Query(&q.usageByDayTenant, "UsageByDayTenant", 3, usage...),
		dbsql.Query(&q.reuseInvalidations, "ReuseInvalidations", 3, invalidation...),
		dbsql.Query(&q.reuseInvalidation, "ReuseInvalidation", 2, invalidation...),
		dbsql.Query(&q.failureRate, "FailureRate", 2, new(*string), new(int64), new(int64), new(bool)),
		dbsql.Query(&q.failureRateTenant, "FailureRateTenant", 3, new(*string), new(int64), new(int64), new(bool)),
	)
}

// summaryRow is a job summary row as scanned.
type summaryRow struct {
	s                   jobSummary
	priority            int16
	state               string
	finished            *time.Time
	errClass, lastError *string
	replayOf            pgtype.UUID
}

func (r *summaryRow) dest() []any {
	s := &r.s
	return []any{(*[16]byte)(&s.ID), &s.Tenant, &s.Kind, &s.Queue, &r.priority, &r.state, &s.Attempt, &s.MaxAttempts,
		&s.CreatedAt, &r.finished, &r.errClass, &r.lastError, &r.replayOf}
}

// queueCountRow is a QueueCounts row as scanned.
type queueCountRow struct {
	q      queueRow
	oldest *time.Time
}

func (r *queueCountRow) dest() []any {
	return []any{&r.q.Queue, &r.q.Runnable.N, &r.oldest, &r.q.Scheduled.N, &r.q.Running.N, &r.q.Partial}
}

// runnerRow is a Runners row as scanned.
type runnerRow struct {
	r     runner
	owner *string
	last  *time.Time
}

func (r *runnerRow) dest() []any { return []any{&r.owner, &r.r.Leases, &r.last, &r.r.LeaseUntil} }

func permitHolderDest(p *permitHolder) []any {
	return []any{&p.Holder, &p.Pool, &p.Permits, &p.ExpiresAt}
}

// serviceLeaseRow is a ServiceLeases row as scanned.
type serviceLeaseRow struct {
	s               serviceLease
	holder          *string
	epoch           *int64
	until, acquired *time.Time
	lastPass        *time.Time
}

func (r *serviceLeaseRow) dest() []any {
	return []any{&r.s.Service, &r.holder, &r.epoch, &r.until, &r.acquired, &r.s.Live, &r.lastPass}
}

// tenantRowScan is a TenantRows row as scanned.
type tenantRowScan struct {
	t      tenantRow
	oldest *time.Time
}

func (r *tenantRowScan) dest() []any {
	t := &r.t
	return []any{&t.Queue, &t.Tenant, &t.Idle, &t.Weight, &t.MaxRunning, &t.OwnLimits,
		&t.Runnable.N, &t.Scheduled.N, &t.Running.N, &r.oldest, &t.AcceptedHour.N, &t.FinishedHour.N}
}

// eventRow is a JobEvents row as scanned.
type eventRow struct {
	gap       bool // the job's outbox range was too large to read whole
	id        pgtype.UUID
	typ       *string // NULL when the row carries only the gap flag
	topic     *string
	created   *time.Time
	published *time.Time
	attempts  *int
	lastError *string
}

func (r *eventRow) dest() []any {
	return []any{&r.gap, &r.id, &r.typ, &r.topic, &r.created, &r.published, &r.attempts, &r.lastError}
}

// event returns the row's event, or false for a row that carries only the
// gap flag (a job with no events read).
func (r *eventRow) event() (event, bool) {
	if !r.id.Valid {
		return event{}, false
	}
	return event{
		ID: r.id.Bytes, Type: dbsql.Deref(r.typ), Topic: dbsql.Deref(r.topic), CreatedAt: dbsql.Deref(r.created),
		PublishedAt: dbsql.Deref(r.published), Attempts: dbsql.Deref(r.attempts), LastError: dbsql.Deref(r.lastError),
	}, true
}

func usageDest(u *usageDay) []any {
	return []any{&u.Tenant, &u.Day, &u.Attempts, &u.Uncertain, &u.InputTokens, &u.OutputTokens, &u.Cost, &u.BatchCost}
}

// invalidationRow is a ReuseInvalidations row as scanned.
type invalidationRow struct {
	inv         jobs.ReuseInvalidation
	key, tenant *string
}

func (r *invalidationRow) dest() []any {
	i := &r.inv
	return []any{&i.ID, &i.Kind, &r.key, &r.tenant, &i.At, &i.By, &i.Reason}
}

func (r *invalidationRow) invalidation() jobs.ReuseInvalidation {
	i := r.inv
	i.Key, i.Tenant = dbsql.Deref(r.key), dbsql.Deref(r.tenant)
	return i
}
