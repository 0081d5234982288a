package jobs

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed batches.sql
var batchesSQL string

// MaxBatchKeyLen bounds EnqueueBatchParams.Key.
const MaxBatchKeyLen = 255

// BatchCompletedEvent is the outbox event type written once per batch,
// when its last job reaches a terminal state.
const BatchCompletedEvent = "batch.completed"

// ErrBatchConflict is returned when a batch key is reused with other jobs.
var ErrBatchConflict = errors.New("jobs: batch key reused with different jobs")

// EnqueueBatchParams accepts jobs as one batch: one object that says how
// far they are, and one event when all of them are finished.
type EnqueueBatchParams struct {
	Tenant string
	// Key makes the whole batch idempotent: accepting it again under the
	// same key returns the batch already accepted and writes nothing (the
	// same key with other jobs is ErrBatchConflict). Required.
	Key string
	// Jobs are the batch's jobs, 1 to MaxBatch. Their Tenant must be empty
	// or the batch's; they carry no IdempotencyKey of their own, since
	// the batch's key stands for them.
	Jobs []EnqueueParams
}

// Batch is a batch's progress, kept with its jobs' transitions: at any
// moment its counts equal what its jobs' states say.
type Batch struct {
	ID     uuid.UUID `json:"id"`
	Tenant string    `json:"tenant"`
	Key    string    `json:"key"`
	Total  int       `json:"total"`
	// Finished counts the jobs in a terminal state: the sum of the four
	// that follow. Total - Finished are waiting or running.
	Finished       int       `json:"finished"`
	Succeeded      int       `json:"succeeded"`
	ReviewRequired int       `json:"review_required"`
	Failed         int       `json:"failed"`
	Cancelled      int       `json:"cancelled"`
	CreatedAt      time.Time `json:"created_at"`
	// FinishedAt is when its last job finished; zero until then.
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// Done reports whether every job of the batch is finished.
func (b *Batch) Done() bool { return b.Finished == b.Total }

// batchCompletedPayload is the payload of a BatchCompletedEvent, as the
// batch_event block of batches.sql writes it.
type batchCompletedPayload struct {
	BatchID        uuid.UUID `json:"batch_id"`
	Tenant         string    `json:"tenant"`
	Key            string    `json:"batch_key"`
	Total          int       `json:"total"`
	Succeeded      int       `json:"succeeded"`
	ReviewRequired int       `json:"review_required"`
	Failed         int       `json:"failed"`
	Cancelled      int       `json:"cancelled"`
}

// ParseBatchCompleted decodes the payload of a BatchCompletedEvent: the
// batch as its last job left it, so Finished equals Total. The event does
// not carry CreatedAt and FinishedAt; they are zero (Store.Batch reads
// them while the batch is kept). A payload that is not such an event is
// an error naming the field that is wrong.
func ParseBatchCompleted(payload []byte) (*Batch, error) {
	var p batchCompletedPayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return nil, fmt.Errorf("jobs: a %s payload: %w", BatchCompletedEvent, err)
	}
	bad := func(field, problem string) error {
		return fmt.Errorf("jobs: a %s payload: %s %s", BatchCompletedEvent, field, problem)
	}
	switch {
	case p.BatchID == uuid.Nil:
		return nil, bad("batch_id", "is missing")
	case p.Tenant == "":
		return nil, bad("tenant", "is missing")
	case p.Total < 1:
		return nil, bad("total", fmt.Sprintf("is %d; a batch has at least one job", p.Total))
	case p.Succeeded < 0 || p.ReviewRequired < 0 || p.Failed < 0 || p.Cancelled < 0:
		return nil, bad("succeeded, review_required, failed and cancelled", "must not be negative")
	case p.Succeeded+p.ReviewRequired+p.Failed+p.Cancelled != p.Total:
		return nil, bad("succeeded, review_required, failed and cancelled",
			fmt.Sprintf("add up to %d, not to total %d", p.Succeeded+p.ReviewRequired+p.Failed+p.Cancelled, p.Total))
	}
	return &Batch{
		ID: p.BatchID, Tenant: p.Tenant, Key: p.Key, Total: p.Total, Finished: p.Total,
		Succeeded: p.Succeeded, ReviewRequired: p.ReviewRequired, Failed: p.Failed, Cancelled: p.Cancelled,
	}, nil
}

// EnqueueBatchResult is what EnqueueBatch accepted.
type EnqueueBatchResult struct {
	Batch *Batch
	// Jobs are the batch's jobs in input order. When Existing they are
	// read back as they are now (a retried upload learns the ids the
	// first answer carried), or nil once retention has pruned any of them.
	Jobs []*Job
	// Existing is true when the key had been accepted before: nothing was
	// written.
	Existing bool
}

// BatchCancelResult says what CancelBatch changed.
type BatchCancelResult struct {
	Cancelled int // waiting jobs now CANCELLED
	Requested int // running jobs whose runners were asked to stop
	Batch     *Batch
}

// EnqueueBatch accepts params.Jobs as one batch, in one transaction (a
// savepoint on a pgx.Tx): the batch row and every job, or nothing. The
// jobs are accepted as EnqueueMany accepts them, with Config.OnAccept.
func (s *PostgresStore) EnqueueBatch(ctx context.Context, db DBTX, params EnqueueBatchParams) (EnqueueBatchResult, error) {
	batch, hash, err := s.prepareBatch(params)
	if err != nil {
		return EnqueueBatchResult{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return EnqueueBatchResult{}, fmt.Errorf("jobs: batch id: %w", err)
	}
	batch.batchID = dbsql.UUID(id)
	var res EnqueueBatchResult
	err = dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		b, inserted, err := s.scanBatch(tx.QueryRow(ctx, s.sql.insertBatch, id, params.Tenant, params.Key, hash,
			s.cfg.EventTopic, len(params.Jobs)))
		if err != nil {
			return err
		}
		if !inserted {
			existing, err := s.batchBy(ctx, tx, s.sql.getBatchByKey, params.Tenant, params.Key)
			if err != nil {
				return err
			}
			if existing.hash != hash {
				return fmt.Errorf("%w: tenant %q, key %q is batch %s", ErrBatchConflict, params.Tenant, params.Key, existing.b.ID)
			}
			res = EnqueueBatchResult{Batch: &existing.b, Existing: true}
			res.Jobs, err = s.batchJobs(ctx, tx, params.Tenant, existing.b)
			return err
		}
		results, err := s.enqueueBatch(ctx, tx, batch)
		if err != nil {
			return err
		}
		res = EnqueueBatchResult{Batch: &b.b, Jobs: make([]*Job, len(results))}
		for i, r := range results {
			res.Jobs[i] = r.Job
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrBatchConflict) || errors.Is(err, ErrInvalidParams) {
			return EnqueueBatchResult{}, err
		}
		return EnqueueBatchResult{}, fmt.Errorf("jobs: enqueueing batch %q: %w", params.Key, err)
	}
	return res, nil
}

// batchJobs reads b's jobs in input order, or nil if any was pruned.
func (s *PostgresStore) batchJobs(ctx context.Context, db DBTX, tenant string, b Batch) ([]*Job, error) {
	rows, err := db.Query(ctx, s.sql.listBatchJobs, tenant, b.ID)
	if err != nil {
		return nil, fmt.Errorf("jobs: reading batch %s's jobs: %w", b.ID, s.explain(err))
	}
	js, err := pgx.CollectRows(rows, scanJobs())
	if err != nil {
		return nil, fmt.Errorf("jobs: reading batch %s's jobs: %w", b.ID, s.explain(err))
	}
	if len(js) != b.Total {
		return nil, nil
	}
	return js, nil
}

// prepareBatch validates params and returns its jobs as an insert batch,
// with the hash of what was asked for.
func (s *PostgresStore) prepareBatch(params EnqueueBatchParams) (*insertBatch, string, error) {
	fail := func(field, problem string) (*insertBatch, string, error) {
		return nil, "", &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	if problem := checkText(params.Tenant, true, MaxTenantLen); problem != "" {
		return fail("Tenant", problem)
	}
	if problem := checkText(params.Key, true, MaxBatchKeyLen); problem != "" {
		return fail("Key", problem)
	}
	if len(params.Jobs) == 0 {
		return fail("Jobs", "the batch is empty")
	}
	jobs := make([]EnqueueParams, len(params.Jobs))
	for i, p := range params.Jobs {
		switch {
		case p.Tenant != "" && p.Tenant != params.Tenant:
			return fail(fmt.Sprintf("Jobs[%d].Tenant", i), fmt.Sprintf("is %q; a batch's jobs are the batch's tenant's (%q)", p.Tenant, params.Tenant))
		case p.IdempotencyKey != "":
			return fail(fmt.Sprintf("Jobs[%d].IdempotencyKey", i), "must be empty: the batch's Key makes the batch idempotent")
		}
		p.Tenant = params.Tenant
		jobs[i] = p
	}
	batch, err := s.prepare(jobs)
	if err != nil {
		var invalid *llmqtype.ValidationError
		if errors.As(err, &invalid) {
			// prepare names the field params[i].X (X alone for one job);
			// here it is Jobs[i].X.
			if rest, ok := strings.CutPrefix(invalid.Field, "params"); ok {
				invalid.Field = "Jobs" + rest
			} else {
				invalid.Field = "Jobs[0]." + invalid.Field
			}
		}
		return nil, "", err
	}
	type asked struct {
		Kind     string          `json:"kind"`
		Queue    string          `json:"queue"`
		Payload  json.RawMessage `json:"payload"`
		Priority int             `json:"priority"`
	}
	what := make([]asked, len(jobs))
	for i := range jobs {
		what[i] = asked{batch.kinds[i], batch.queues[i], json.RawMessage(batch.payloads[i]), int(batch.priorities[i])}
	}
	hash, err := RequestHash(what)
	if err != nil {
		return nil, "", err
	}
	return batch, hash, nil
}

// Batch returns the tenant's batch, or ErrNotFound. One primary-key probe,
// whatever the batch's size.
func (s *PostgresStore) Batch(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Batch, error) {
	r, err := s.batchBy(ctx, db, s.sql.getBatch, tenant, id)
	if err != nil {
		return nil, err
	}
	return &r.b, nil
}

// CancelBatch cancels the tenant's batch: its waiting jobs become
// CANCELLED at once, each with its "<kind>.cancelled" event, and its
// running jobs are asked to stop, as Cancel does for one job. A finished
// job keeps its outcome. It returns the batch as it now is, or
// ErrNotFound.
func (s *PostgresStore) CancelBatch(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (BatchCancelResult, error) {
	var res BatchCancelResult
	if err := db.QueryRow(ctx, s.sql.cancelBatch, tenant, id, s.cfg.EventTopic).Scan(&res.Cancelled, &res.Requested); err != nil {
		return BatchCancelResult{}, fmt.Errorf("jobs: cancelling batch %s: %w", id, s.explain(err))
	}
	b, err := s.Batch(ctx, db, tenant, id)
	if err != nil {
		return BatchCancelResult{}, err
	}
	res.Batch = b
	return res, nil
}

func (s *PostgresStore) batchBy(ctx context.Context, db DBTX, query, tenant string, key any) (batchRow, error) {
	r, found, err := s.scanBatch(db.QueryRow(ctx, query, tenant, key))
	switch {
	case err != nil:
		return batchRow{}, fmt.Errorf("jobs: reading batch %v: %w", key, err)
	case !found:
		return batchRow{}, fmt.Errorf("%w: batch %v of tenant %q", ErrNotFound, key, tenant)
	}
	return r, nil
}

// scanBatch reads one batch_columns row; found is false for none.
func (s *PostgresStore) scanBatch(row pgx.Row) (batchRow, bool, error) {
	var r batchRow
	err := row.Scan(r.dest()...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return batchRow{}, false, nil
	case err != nil:
		return batchRow{}, false, s.explain(err)
	}
	r.b.FinishedAt = dbsql.Deref(r.finishedAt)
	return r, true, nil
}

// batchRow is a row of the batch_columns fragment as scanned.
type batchRow struct {
	b          Batch
	hash       string
	finishedAt *time.Time
}

func (r *batchRow) dest() []any {
	b := &r.b
	return []any{&b.ID, &b.Tenant, &b.Key, &r.hash, &b.Total, &b.Finished, &b.Succeeded, &b.ReviewRequired,
		&b.Failed, &b.Cancelled, &b.CreatedAt, &r.finishedAt}
}
