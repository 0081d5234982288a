package webhook

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed prune.sql
var pruneSQL string

// MaxPruneBatch bounds the deliveries one Pruner call deletes.
const MaxPruneBatch = 10_000

// Pruner deletes deliveries past a retention given per call, with their
// attempts, one batch at a time, for a maintenance service that paces its
// own work. It runs Store.Prune's statement, so both may run at once. It
// holds no connections and is safe for concurrent use.
type Pruner struct {
	sql statements
}

// NewPruner prepares the pruner's SQL for schema ("" is the default
// schema).
func NewPruner(schema string) (*Pruner, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	p := &Pruner{}
	if _, err := p.sql.load(s); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	return p, nil
}

// Prune deletes up to limit deliveries created more than olderThan ago,
// oldest first, with their attempts, and returns how many deliveries. It
// never deletes a delivery whose job is waiting, running or retrying, or
// a dead letter that jobs.Replay can replay (FAILED_TERMINAL,
// REVIEW_REQUIRED, CANCELLED): those are kept whatever their age, until
// every job of theirs has succeeded or retention has deleted it.
func (p *Pruner) Prune(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	if err := checkPrune(olderThan, limit); err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, p.sql.pruneDeliveries, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("webhook: pruning deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Count counts the deliveries Prune would delete with no limit: like
// Prune, one index probe of the jobs per delivery older than olderThan.
func (p *Pruner) Count(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	if err := checkPrune(olderThan, 1); err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, p.sql.countDeliveries, olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("webhook: counting deliveries due for pruning: %w", err)
	}
	return n, nil
}

// Oldest returns when the oldest delivery was created, or the zero time
// when there is none. It may be one that Prune keeps (in flight, or a dead
// letter's), so it is not a measure of pruning lag.
func (p *Pruner) Oldest(ctx context.Context, db DBTX) (time.Time, error) {
	var at *time.Time
	if err := db.QueryRow(ctx, p.sql.oldestDelivery).Scan(&at); err != nil {
		return time.Time{}, fmt.Errorf("webhook: reading the oldest delivery: %w", err)
	}
	return dbsql.Deref(at), nil
}

func checkPrune(olderThan time.Duration, limit int) error {
	switch {
	case olderThan <= 0:
		return &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "olderThan", Problem: "must be positive"}
	case limit < 1 || limit > MaxPruneBatch:
		return &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "limit", Problem: fmt.Sprintf("is %d; use 1 to %d", limit, MaxPruneBatch)}
	}
	return nil
}

// RetentionFloor is the least retention of deliveries llmq accepts:
// schedule's whole span plus 24h. A nil schedule means DefaultSchedule (a
// floor of about two days). Config.Retention is checked against the same
// floor. It is not what keeps deliveries in flight or dead letters (Prune
// keeps those whatever their age: no schedule bounds how long a delivery
// waits behind its endpoint's earlier ones, or on Retry-After); it keeps a
// finished delivery's attempts to look at, and its event id deduplicated
// by Enqueue, for at least as long as a schedule may run.
func RetentionFloor(schedule []time.Duration) time.Duration {
	if schedule == nil {
		schedule = DefaultSchedule()
	}
	var span time.Duration
	for _, d := range schedule {
		span += d
	}
	return span + 24*time.Hour
}
