package jobs

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed prune.sql
var pruneSQL string

// MaxPruneBatch bounds the jobs one PruneFinished call deletes: a batch is
// one statement in one short transaction, and its locks and WAL grow with
// it.
const MaxPruneBatch = 10_000

// Pruner deletes finished jobs, with their attempts, steps and keys, and
// finished batches, once they are older than their retention. It holds no connections and is safe for
// concurrent use; the retention package decides when, and how much, to
// delete.
type Pruner struct {
	sql statements
}

// NewPruner prepares the pruner's SQL for schema ("" is the default
// schema).
func NewPruner(schema string) (*Pruner, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	p := &Pruner{}
	if _, err := p.sql.load(s); err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	return p, nil
}

// PruneResult counts the rows one PruneFinished call deleted.
type PruneResult struct {
	Jobs     int64 // jobs rows
	Attempts int64 // their job_attempts rows
	Keys     int64 // their job_keys rows: tenant listing, idempotency and replay keys
	Steps    int64 // their job_steps rows: stored step outputs
}

// PruneFinished deletes up to limit jobs of the finished state that
// finished more than olderThan ago (by the database's clock), oldest
// first, with their attempt rows, stored steps and job_keys rows, in one
// statement. A waiting or running job is never deleted, whatever its age. Once a job
// is deleted its idempotency key is free: the same key accepts a new job.
// Run it on a transaction to make it part of a larger unit (the retention
// service fences each batch with its lease this way).
func (p *Pruner) PruneFinished(ctx context.Context, db DBTX, state State, olderThan time.Duration, limit int) (PruneResult, error) {
	if err := checkPrune(state, olderThan); err != nil {
		return PruneResult{}, err
	}
	if limit < 1 || limit > MaxPruneBatch {
		return PruneResult{}, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "limit", Problem: fmt.Sprintf("is %d; use 1 to %d", limit, MaxPruneBatch)}
	}
	var r PruneResult
	if err := db.QueryRow(ctx, p.sql.prune, string(state), olderThan.Milliseconds(), limit).Scan(pruneDest(&r)...); err != nil {
		return PruneResult{}, fmt.Errorf("jobs: pruning %s jobs: %w", state, err)
	}
	return r, nil
}

// CountFinished counts the jobs PruneFinished would delete with no limit:
// those of state finished more than olderThan ago.
func (p *Pruner) CountFinished(ctx context.Context, db DBTX, state State, olderThan time.Duration) (int64, error) {
	if err := checkPrune(state, olderThan); err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, p.sql.countFinished, string(state), olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("jobs: counting %s jobs due for pruning: %w", state, err)
	}
	return n, nil
}

// OldestFinished returns when the oldest job of the finished state
// finished, or the zero time when there is none.
func (p *Pruner) OldestFinished(ctx context.Context, db DBTX, state State) (time.Time, error) {
	if err := checkPrune(state, time.Nanosecond); err != nil {
		return time.Time{}, err
	}
	var at *time.Time
	if err := db.QueryRow(ctx, p.sql.oldestFinished, string(state)).Scan(&at); err != nil {
		return time.Time{}, fmt.Errorf("jobs: reading the oldest %s job: %w", state, err)
	}
	return dbsql.Deref(at), nil
}

// PruneBatches deletes up to limit batch rows (EnqueueBatch) that
// finished more than olderThan ago, oldest first. An open batch is never
// deleted. A batch's jobs are pruned by state, on their own retentions;
// pass at least the longest of those (the retention service does), or a
// job may outlive its batch, whose Batch is then ErrNotFound.
func (p *Pruner) PruneBatches(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	return pruneOlderThan(ctx, db, p.sql.pruneBatches, "batches", olderThan, limit)
}

// pruneOlderThan runs a statement deleting up to limit ($2) rows of what
// older than olderThan ($1, in ms), after checking both.
func pruneOlderThan(ctx context.Context, db DBTX, stmt, what string, olderThan time.Duration, limit int) (int64, error) {
	if olderThan <= 0 {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "olderThan", Problem: "must be positive"}
	}
	if limit < 1 || limit > MaxPruneBatch {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "limit", Problem: fmt.Sprintf("is %d; use 1 to %d", limit, MaxPruneBatch)}
	}
	tag, err := db.Exec(ctx, stmt, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("jobs: pruning %s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}

// countOlderThan runs a statement counting the rows of what older than
// olderThan ($1, in ms): what the matching prune would delete.
func countOlderThan(ctx context.Context, db DBTX, stmt, what string, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "olderThan", Problem: "must be positive"}
	}
	var n int64
	if err := db.QueryRow(ctx, stmt, olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("jobs: counting %s due for pruning: %w", what, err)
	}
	return n, nil
}

// ReuseInvalidationRetention is how long an invalidation of reused results
// (PostgresStore.InvalidateReuse) must be kept when computed SUCCEEDED
// jobs are kept for succeeded (Never: forever): until no result it covers
// can be reused. A covered result's attempt started before the
// invalidation, so it finished at most an attempt's length later, and it
// is reusable only while its job is kept and within MaxReuseTTL; a week
// covers the longest attempt (a provider batch's runs for up to a day
// and its results are applied after).
func ReuseInvalidationRetention(succeeded time.Duration) time.Duration {
	const longestAttempt = 7 * 24 * time.Hour
	if succeeded < 0 || succeeded > MaxReuseTTL {
		succeeded = MaxReuseTTL
	}
	return succeeded + longestAttempt
}

// PruneReuseInvalidations deletes up to limit reuse invalidations recorded
// more than olderThan ago (ReuseInvalidationRetention says how long is
// long enough), oldest first.
func (p *Pruner) PruneReuseInvalidations(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	return pruneOlderThan(ctx, db, p.sql.pruneInvalidations, "reuse invalidations", olderThan, limit)
}

// CountReuseInvalidations counts the invalidations
// PruneReuseInvalidations would delete with no limit.
func (p *Pruner) CountReuseInvalidations(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	return countOlderThan(ctx, db, p.sql.countInvalidations, "reuse invalidations", olderThan)
}

// CountBatches counts the batches PruneBatches would delete with no
// limit: those finished more than olderThan ago.
func (p *Pruner) CountBatches(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	return countOlderThan(ctx, db, p.sql.countBatches, "batches", olderThan)
}

// ExactSizeLimit is how many jobs of a state SizeFinished counts before
// it estimates instead.
const ExactSizeLimit = 10_000

// Size is how many rows a class holds: exact, or an estimate.
type Size struct {
	Rows      int64
	Estimated bool
}

// estimateOrder is the order of EstimateFinished's branches.
var estimateOrder = [...]State{StateSucceeded, StateReviewRequired, StateFailedTerminal, StateCancelled}

// SizeFinished returns how many jobs of each finished state the table
// holds: counted exactly up to ExactSizeLimit (an index-only range of
// jobs_finished_idx, bounded), and beyond it estimated from the planner's
// statistics (Estimated; as fresh as the table's last ANALYZE, scaled to
// its size now, and never below the limit). Its cost does not grow with
// history.
func (p *Pruner) SizeFinished(ctx context.Context, db DBTX) (map[State]Size, error) {
	sizes := make(map[State]Size, len(estimateOrder))
	capped := false
	for _, state := range estimateOrder {
		var n int64
		if err := db.QueryRow(ctx, p.sql.countUpTo, string(state), ExactSizeLimit).Scan(&n); err != nil {
			return nil, fmt.Errorf("jobs: counting %s jobs: %w", state, err)
		}
		sizes[state] = Size{Rows: n}
		capped = capped || n >= ExactSizeLimit
	}
	if !capped {
		return sizes, nil
	}
	estimates, err := p.estimateFinished(ctx, db)
	if err != nil {
		return nil, err
	}
	for i, state := range estimateOrder {
		if sizes[state].Rows >= ExactSizeLimit {
			sizes[state] = Size{Rows: max(ExactSizeLimit, estimates[i]), Estimated: true}
		}
	}
	return sizes, nil
}

// estimateFinished reads the planner's row estimate of each branch of
// EstimateFinished.
func (p *Pruner) estimateFinished(ctx context.Context, db DBTX) ([]int64, error) {
	var raw []byte
	if err := db.QueryRow(ctx, p.sql.estimateFinished).Scan(&raw); err != nil {
		return nil, fmt.Errorf("jobs: estimating finished jobs: %w", err)
	}
	var plans []struct {
		Plan struct {
			Plans []struct {
				Rows float64 `json:"Plan Rows"`
			} `json:"Plans"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil {
		return nil, fmt.Errorf("jobs: estimating finished jobs: reading the plan: %w", err)
	}
	if len(plans) != 1 || len(plans[0].Plan.Plans) != len(estimateOrder) {
		return nil, fmt.Errorf("jobs: estimating finished jobs: the plan has not one branch per state: %s", raw)
	}
	out := make([]int64, len(estimateOrder))
	for i, b := range plans[0].Plan.Plans {
		out[i] = int64(b.Rows)
	}
	return out, nil
}

func checkPrune(state State, olderThan time.Duration) error {
	if !state.Terminal() {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "state", Problem: fmt.Sprintf("is %q; only finished states are pruned", state)}
	}
	if olderThan <= 0 {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "olderThan", Problem: "must be positive"}
	}
	return nil
}
