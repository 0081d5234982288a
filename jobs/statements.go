package jobs

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
)

// statements is every statement of queries.sql, operator_list.sql,
// steps.sql, batches.sql, prune.sql, reuse.sql and candidates.sql, with the shape the code binds and scans; dbsqltest checks it
// against the schema. NewStore and NewPruner each load all of them, so a
// statement missing from the files, or one no spec declares, stops
// construction.
type statements struct {
	// queries.sql: accepting and reading jobs.
	insertJob, insertJobs, selectByKey, get, list, cancel, stats, queueDepth string
	// queries.sql: claiming, leases and transitions.
	claimSettings, lockClaimTenants, claim, claimSkippingLocked, wakeIdleTenants string
	keyedPlans, restorePlans                                                     string
	heartbeat, leases, complete, move                                            string
	markStale, markHung, reap, failDeadlines, replay, attempts, unservedKinds    string
	// queries.sql: tenant limits and operator reads.
	setTenantLimits, deleteTenantLimits, getTenantLimits, listTenantLimits string
	lookup, deadLetters, tenantBacklogs, kindBacklogs                      string
	// operator_list.sql
	listAll string
	// steps.sql
	takeStep, saveStep, listSteps string
	// batches.sql
	insertBatch, getBatch, getBatchByKey, listBatchJobs, cancelBatch string
	// prune.sql
	prune, countFinished, oldestFinished, countUpTo, estimateFinished  string
	pruneBatches, countBatches, pruneInvalidations, countInvalidations string
	// reuse.sql
	invalidateReuse, listInvalidations string
	// candidates.sql
	candidateStats string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	job := new(jobRow).dest()
	stepDest := new(stepRow).dest()
	batch := new(batchRow).dest()
	return dbsql.Load(schema, []string{queriesSQL, operatorListSQL, stepsSQL, batchesSQL, pruneSQL, reuseSQL, candidatesSQL},
		dbsql.Query(&q.insertJob, "InsertJob", 23, job...).
			Binds(newInsertBatch(1).one("", "", []string{}, new(string), []string{})...),
		dbsql.Query(&q.insertJobs, "InsertJobs", 23, job...).
			Binds(new(insertBatch).args("", "", []string{}, new(string), []string{})...),
		dbsql.Query(&q.selectByKey, "SelectJobsByIdempotencyKey", 2, job...),
		dbsql.Query(&q.get, "GetJob", 2, job...),
		// ListJobs and ListAllJobs bind their filters, then the page's
		// cursor and limit (see fetchPage).
		dbsql.Query(&q.list, "ListJobs", 5, job...),
		dbsql.Query(&q.listAll, "ListAllJobs", 4, job...),
		dbsql.Query(&q.cancel, "CancelJob", 4, job...),
		dbsql.Query(&q.stats, "QueueStats", 0, new(string), new(string), new(int64), new(float64)),
		dbsql.Query(&q.queueDepth, "QueueDepth", 0, new(depthRow).dest()...),
		dbsql.Query(&q.lockClaimTenants, "LockClaimTenants", 2, new(tenantCandidate).dest()...),
		dbsql.Query(&q.claimSettings, "ClaimSettings", 2, new(string), new(string), new(string), new(string)),
		dbsql.Query(&q.keyedPlans, "KeyedPlans", 0, new(string), new(string)),
		dbsql.Query(&q.restorePlans, "RestorePlans", 0, new(string)),
		dbsql.Query(&q.claim, "ClaimJobs", 9, new(claimedRow).dest()...),
		dbsql.Query(&q.claimSkippingLocked, "ClaimJobsSkippingLocked", 9, new(claimedRow).dest()...),
		dbsql.Exec(&q.wakeIdleTenants, "WakeIdleTenants", 2),
		dbsql.Query(&q.heartbeat, "HeartbeatLeases", 4, new([16]byte), new(bool)),
		dbsql.Query(&q.leases, "ListLeases", 2, job...),
		dbsql.Query(&q.complete, "CompleteJobs", 17, new(completedRow).dest()...),
		dbsql.Query(&q.move, "MoveJob", 6, job...).Binds(pgtype.UUID{}, int64(0), "", "", "", ""),
		dbsql.Exec(&q.markStale, "MarkStaleAttempts", 8),
		dbsql.Query(&q.markHung, "MarkHungAttempts", 4, new([16]byte), new(int64)),
		dbsql.Query(&q.reap, "ReapExpiredLeases", 8, new(int), new(int)),
		dbsql.Query(&q.failDeadlines, "FailExpiredDeadlines", 2, new(int)),
		dbsql.Query(&q.replay, "ReplayJob", 11, job...),
		dbsql.Query(&q.attempts, "ListAttempts", 2, new(attemptRow).dest()...),
		dbsql.Query(&q.unservedKinds, "UnservedKinds", 3, new(string), new(int64), new(float64)),
		dbsql.Exec(&q.setTenantLimits, "SetTenantLimits", 3),
		dbsql.Exec(&q.deleteTenantLimits, "DeleteTenantLimits", 1),
		dbsql.Query(&q.getTenantLimits, "GetTenantLimits", 1, limitsDest(new(TenantLimits))...),
		dbsql.Query(&q.listTenantLimits, "ListTenantLimits", 0, tenantLimitsDest(new(string), new(TenantLimits))...),
		dbsql.Query(&q.lookup, "LookupJob", 1, job...),
		dbsql.Query(&q.deadLetters, "ListDeadLetters", 1, job...),
		dbsql.Query(&q.tenantBacklogs, "TenantBacklogs", 0, new(tenantBacklogRow).dest()...),
		dbsql.Query(&q.kindBacklogs, "KindBacklogs", 0, new(kindBacklogRow).dest()...),
		dbsql.Query(&q.takeStep, "TakeStep", 3, append([]any{new(bool)}, stepDest[2:]...)...),
		dbsql.Query(&q.saveStep, "SaveStep", 7, append([]any{new(bool)}, stepDest[2:]...)...),
		dbsql.Query(&q.listSteps, "ListSteps", 2, stepDest...),
		dbsql.Query(&q.insertBatch, "InsertBatch", 6, batch...),
		dbsql.Query(&q.getBatch, "GetBatch", 2, batch...),
		dbsql.Query(&q.getBatchByKey, "GetBatchByKey", 2, batch...),
		dbsql.Query(&q.listBatchJobs, "ListBatchJobs", 2, job...),
		dbsql.Query(&q.cancelBatch, "CancelBatch", 3, new(int64), new(int64)),
		dbsql.Query(&q.prune, "PruneFinished", 3, pruneDest(new(PruneResult))...),
		dbsql.Query(&q.countFinished, "CountFinished", 2, new(int64)),
		dbsql.Exec(&q.pruneBatches, "PruneBatches", 2),
		dbsql.Exec(&q.pruneInvalidations, "PruneReuseInvalidations", 2),
		dbsql.Query(&q.countInvalidations, "CountReuseInvalidations", 1, new(int64)),
		dbsql.Query(&q.countBatches, "CountBatches", 1, new(int64)),
		dbsql.Query(&q.oldestFinished, "OldestFinished", 1, new(*time.Time)),
		dbsql.Query(&q.countUpTo, "CountFinishedUpTo", 2, new(int64)),
		dbsql.Query(&q.estimateFinished, "EstimateFinished", 0, new([]byte)),
		dbsql.Query(&q.invalidateReuse, "InvalidateReuse", 6, append(new(invalidationRow).dest(), new(int64))...),
		dbsql.Query(&q.listInvalidations, "ListReuseInvalidations", 2, new(invalidationRow).dest()...),
		dbsql.Query(&q.candidateStats, "CandidateStats", 3, new(CandidateStats).dest()...),
	)
}

// jobRow is a row of the job_columns fragment as scanned: every statement
// that returns jobs returns these columns, in this order.
//
// Nullable columns scan into pgtype values rather than pointers: pgx
// allocates a pointer's target for every non-NULL value it scans, and a
// claim and a completion scan rows by the thousand.
type jobRow struct {
	j                                          Job
	key, hash, group, owner, errClass, lastErr pgtype.Text
	replayedBy, replayReason                   pgtype.Text
	leaseUntil, attemptedAt, deadline          pgtype.Timestamptz
	cancelReq, finished                        pgtype.Timestamptz
	traceParent                                pgtype.Text
	replayOf, batchID                          pgtype.UUID
	priority                                   int16
	state                                      string
	reuseKey                                   pgtype.Text
	reuseShared                                pgtype.Bool
	reuseTTL                                   pgtype.Int8 // milliseconds
	reusedFrom                                 pgtype.UUID
}

func (r *jobRow) dest() []any {
	j := &r.j
	return []any{
		(*[16]byte)(&j.ID), &j.Tenant, &j.Kind, &j.Queue, &r.priority, &r.key, &r.hash, dbsql.RawJSON(&j.Payload),
		&r.group, &r.state, &j.Attempt, &j.MaxAttempts, &j.Fence, &r.owner, &r.leaseUntil, &r.attemptedAt,
		&j.AvailableAt, &r.deadline, &j.StateVersion, &j.EstimatedTokens, dbsql.RawJSON(&j.Result),
		&r.errClass, &r.lastErr, &r.replayOf, &r.replayedBy, &r.replayReason,
		&r.cancelReq, &j.CreatedAt, &j.UpdatedAt, &r.finished, &r.traceParent, &r.batchID,
		&r.reuseKey, &r.reuseShared, &r.reuseTTL, &r.reusedFrom,
	}
}

func (r *jobRow) job() *Job {
	j := r.j
	j.Priority = int(r.priority)
	j.State = State(r.state)
	j.IdempotencyKey, j.RequestHash, j.GroupKey = r.key.String, r.hash.String, r.group.String
	j.LeaseOwner, j.ErrorClass, j.LastError = r.owner.String, r.errClass.String, r.lastErr.String
	j.LeaseUntil, j.AttemptedAt, j.DeadlineAt = r.leaseUntil.Time, r.attemptedAt.Time, r.deadline.Time
	j.CancelRequested, j.FinishedAt = r.cancelReq.Time, r.finished.Time
	if r.replayOf.Valid {
		j.ReplayOf = r.replayOf.Bytes
	}
	if r.batchID.Valid {
		j.BatchID = r.batchID.Bytes
	}
	j.ReplayedBy, j.ReplayReason = r.replayedBy.String, r.replayReason.String
	j.TraceParent = r.traceParent.String
	if r.reuseKey.Valid {
		j.Reuse = &Reuse{Key: r.reuseKey.String, Shared: r.reuseShared.Bool, TTL: time.Duration(r.reuseTTL.Int64) * time.Millisecond}
	}
	if r.reusedFrom.Valid {
		j.ReusedFrom = r.reusedFrom.Bytes
	}
	return &j
}

// completedRow is a CompleteJobs row: what a completion wrote (see
// CompletionResult).
type completedRow struct {
	r                                            CompletionResult
	state, errClass, lastErr                     pgtype.Text
	maxAttempts                                  int32
	finished, leaseUntil, cancelReq, availableAt pgtype.Timestamptz
	reusedFrom                                   pgtype.UUID
}

func (r *completedRow) dest() []any {
	c := &r.r
	return []any{
		(*[16]byte)(&c.JobID), &r.state, &c.StateVersion, &c.Fence, &r.maxAttempts, &r.availableAt, &r.finished,
		&r.errClass, &r.lastErr, &r.reusedFrom, &c.UpdatedAt, &r.leaseUntil, &r.cancelReq,
		dbsql.RawJSON(&c.keptResult),
	}
}

// scanCompleted returns the scanner of one CompleteJobs statement's rows,
// reusing its row and destinations as scanJobs does.
func scanCompleted() pgx.RowToFunc[CompletionResult] {
	var r completedRow
	dest := r.dest()
	return func(row pgx.CollectableRow) (CompletionResult, error) {
		r = completedRow{}
		if err := row.Scan(dest...); err != nil {
			return CompletionResult{}, err
		}
		return r.result(), nil
	}
}

// result is the scanned row as a CompletionResult.
func (r *completedRow) result() CompletionResult {
	c := r.r
	c.State, c.ErrorClass, c.LastError = State(r.state.String), r.errClass.String, r.lastErr.String
	c.MaxAttempts = int(r.maxAttempts)
	c.AvailableAt, c.FinishedAt = r.availableAt.Time, r.finished.Time
	c.LeaseUntil, c.CancelRequested = r.leaseUntil.Time, r.cancelReq.Time
	if r.reusedFrom.Valid {
		c.ReusedFrom = r.reusedFrom.Bytes
	}
	return c
}

// claimedRow is a ClaimJobs row: the job, then the result it is to reuse
// and that result's job (both NULL when it has none).
type claimedRow struct {
	jobRow
	sourceID     pgtype.UUID
	sourceResult json.RawMessage
}

func (r *claimedRow) dest() []any {
	return append(r.jobRow.dest(), &r.sourceID, dbsql.RawJSON(&r.sourceResult))
}

func (r *claimedRow) job() *Job {
	j := r.jobRow.job()
	if r.sourceID.Valid {
		j.ReusedFrom = r.sourceID.Bytes
		j.Result = r.sourceResult
	}
	return j
}

// scanClaimed returns the scanner of one claim's rows, reusing its row and
// destinations as scanJobs does.
func scanClaimed() pgx.RowToFunc[*Job] {
	var r claimedRow
	dest := r.dest()
	return func(row pgx.CollectableRow) (*Job, error) {
		r = claimedRow{}
		if err := row.Scan(dest...); err != nil {
			return nil, err
		}
		return r.job(), nil
	}
}

func (c *tenantCandidate) dest() []any {
	return []any{&c.tenant, &c.vtime, &c.weight, &c.maxRunning, &c.running}
}

func limitsDest(l *TenantLimits) []any { return []any{&l.Weight, &l.MaxRunning} }

// tenantLimitsDest is a ListTenantLimits row: the tenant, then its limits.
func tenantLimitsDest(tenant *string, l *TenantLimits) []any {
	return append([]any{tenant}, limitsDest(l)...)
}

func pruneDest(r *PruneResult) []any { return []any{&r.Jobs, &r.Attempts, &r.Keys, &r.Steps} }

// seconds turns an age the SQL returns in seconds into a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// depthRow is a QueueDepth row as scanned.
type depthRow struct {
	d   QueueDepth
	age float64 // seconds
}

func (r *depthRow) dest() []any {
	return []any{&r.d.Queue, &r.d.Runnable, &r.d.Scheduled, &r.d.Running, &r.age}
}

func (r *depthRow) depth() QueueDepth {
	d := r.d
	d.OldestRunnableAge = seconds(r.age)
	return d
}

// tenantBacklogRow is a TenantBacklogs row as scanned.
type tenantBacklogRow struct {
	b      TenantBacklog
	oldest float64 // seconds
}

func (r *tenantBacklogRow) dest() []any {
	b := &r.b
	return []any{&b.Queue, &b.Tenant, &b.Runnable, &b.Scheduled, &b.Running, &r.oldest,
		&b.Limits.Weight, &b.Limits.MaxRunning, &b.OwnLimits}
}

func (r *tenantBacklogRow) backlog() TenantBacklog {
	b := r.b
	b.OldestRunnableAge = seconds(r.oldest)
	return b
}

// kindBacklogRow is a KindBacklogs row as scanned.
type kindBacklogRow struct {
	b      KindBacklog
	oldest float64 // seconds
}

func (r *kindBacklogRow) dest() []any {
	b := &r.b
	return []any{&b.Queue, &b.Kind, &b.Runnable, &b.Scheduled, &b.Running, &r.oldest}
}

func (r *kindBacklogRow) backlog() KindBacklog {
	b := r.b
	b.OldestRunnableAge = seconds(r.oldest)
	return b
}

// attemptRow is a ListAttempts row as scanned.
type attemptRow struct {
	a                       Attempt
	ended, retryAt          *time.Time
	outcome, class, message *string
	inTokens, outTokens     *int64
	reusedFrom              pgtype.UUID
	candidate, model        *string
	moves                   json.RawMessage
}

func (r *attemptRow) dest() []any {
	a := &r.a
	return []any{&a.JobID, &a.Attempt, &a.Fence, &a.Worker, &a.StartedAt, &r.ended, &r.outcome,
		&r.class, &r.message, &r.retryAt, &r.inTokens, &r.outTokens, &a.Usage.Uncertain, &r.reusedFrom,
		&r.candidate, &r.model, dbsql.RawJSON(&r.moves)}
}

// attempt returns the scanned attempt, or an error for moves that are not
// the JSON array Complete writes.
func (r *attemptRow) attempt() (Attempt, error) {
	a := r.a
	a.EndedAt, a.RetryAt = dbsql.Deref(r.ended), dbsql.Deref(r.retryAt)
	a.Outcome = AttemptOutcome(dbsql.Deref(r.outcome))
	a.ErrorClass, a.Error = dbsql.Deref(r.class), dbsql.Deref(r.message)
	a.Usage.InputTokens, a.Usage.OutputTokens = dbsql.Deref(r.inTokens), dbsql.Deref(r.outTokens)
	if r.reusedFrom.Valid {
		a.ReusedFrom = r.reusedFrom.Bytes
	}
	a.Candidate, a.Model = dbsql.Deref(r.candidate), dbsql.Deref(r.model)
	if len(r.moves) > 0 {
		if err := json.Unmarshal(r.moves, &a.Moves); err != nil {
			return a, fmt.Errorf("attempt %d's moves: %w", a.Attempt, err)
		}
	}
	return a, nil
}
