package inbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
)

//go:embed prune.sql
var pruneSQL string

// MaxPruneBatch bounds the ids one Pruner call deletes.
const MaxPruneBatch = 10_000

// Pruner deletes accepted ids past a retention given per call, one batch
// at a time, for a maintenance service that paces its own work. It runs
// Store.Prune's statement, so both may run at once. It holds no
// connections and is safe for concurrent use.
type Pruner struct {
	sql statements
}

// NewPruner prepares the pruner's SQL for schema ("" is the default
// schema).
func NewPruner(schema string) (*Pruner, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	p := &Pruner{}
	if _, err := p.sql.load(s); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	return p, nil
}

// Prune deletes up to limit ids received more than olderThan ago, oldest
// first, and returns how many. olderThan must be at least MinRetention: an
// id forgotten while its sender may still redeliver it would be processed
// twice.
func (p *Pruner) Prune(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	if err := checkPrune(olderThan, limit); err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, p.sql.prune, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("inbox: pruning: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Count counts the ids Prune would delete with no limit.
func (p *Pruner) Count(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	if err := checkPrune(olderThan, 1); err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, p.sql.count, olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: counting ids due for pruning: %w", err)
	}
	return n, nil
}

// Oldest returns when the oldest remembered id was received, or the zero
// time when there is none.
func (p *Pruner) Oldest(ctx context.Context, db DBTX) (time.Time, error) {
	var at *time.Time
	if err := db.QueryRow(ctx, p.sql.oldest).Scan(&at); err != nil {
		return time.Time{}, fmt.Errorf("inbox: reading the oldest id: %w", err)
	}
	return dbsql.Deref(at), nil
}

// PruneQuarantine deletes up to limit quarantined messages received more
// than olderThan ago, oldest first, and returns how many. Quarantined
// messages were never processed and are kept for people; there is no
// floor beyond a positive age, since forgetting one cannot make a message
// run twice.
func (p *Pruner) PruneQuarantine(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (int64, error) {
	if err := checkQuarantinePrune(olderThan, limit); err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, p.sql.pruneQuarantine, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("inbox: pruning quarantine: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountQuarantine counts the messages PruneQuarantine would delete with
// no limit.
func (p *Pruner) CountQuarantine(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	if err := checkQuarantinePrune(olderThan, 1); err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, p.sql.countQuarantine, olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: counting quarantined messages due for pruning: %w", err)
	}
	return n, nil
}

// OldestQuarantine returns when the oldest quarantined message was
// received, or the zero time when there is none.
func (p *Pruner) OldestQuarantine(ctx context.Context, db DBTX) (time.Time, error) {
	var at *time.Time
	err := db.QueryRow(ctx, p.sql.oldestQuarantine).Scan(&at)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("inbox: reading the oldest quarantined message: %w", err)
	}
	return dbsql.Deref(at), nil
}

func checkQuarantinePrune(olderThan time.Duration, limit int) error {
	switch {
	case olderThan <= 0:
		return fmt.Errorf("inbox: pruning quarantine: olderThan is %s; use a positive duration", olderThan)
	case limit < 1 || limit > MaxPruneBatch:
		return fmt.Errorf("inbox: pruning quarantine: limit is %d; use 1 to %d", limit, MaxPruneBatch)
	}
	return nil
}

func checkPrune(olderThan time.Duration, limit int) error {
	switch {
	case olderThan < MinRetention:
		return fmt.Errorf("inbox: pruning: olderThan is %s; use at least %s, to outlast the sender's redeliveries", olderThan, MinRetention)
	case limit < 1 || limit > MaxPruneBatch:
		return fmt.Errorf("inbox: pruning: limit is %d; use 1 to %d", limit, MaxPruneBatch)
	}
	return nil
}
