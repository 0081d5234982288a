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
// oldest first, with their attempts, and returns how many deliveries.
// olderThan should exceed the delivery schedule's span by a day (see
// Config.Retention): a dead letter replayed after its delivery was pruned
// fails with ErrNotFound.
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

// Count counts the deliveries Prune would delete with no limit.
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
// when there is none.
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

// RetentionFloor is the least retention of deliveries that keeps every
// delivery until its schedule has run its course, plus a day to replay a
// dead letter: schedule's whole span plus 24h. A nil schedule means
// DefaultSchedule (a floor of about two days). Config.Retention is checked
// against the same floor.
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
