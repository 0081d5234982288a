package admission

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

// Pruner reaps expired permits of every pool, for a maintenance service:
// a pool with acquirers reaps its own at each grant cycle, an idle pool's
// expired permits wait for this. The usage ledger is never pruned. It
// holds no connections and is safe for concurrent use.
type Pruner struct {
	sql statements
}

// NewPruner prepares the pruner's SQL for schema ("" is the default
// schema).
func NewPruner(schema string) (*Pruner, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	p := &Pruner{}
	if _, err := p.sql.load(s); err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	return p, nil
}

// ReapExpired deletes every expired permit, pool by pool, handing each
// pool's slots back in the same statement, and returns how many it
// deleted. A pool is one statement, but its row lock is held until the
// caller's transaction ends: a grant cycle of that pool waits for it, so
// run ReapExpired in a short transaction of its own.
func (p *Pruner) ReapExpired(ctx context.Context, db DBTX) (int64, error) {
	rows, err := db.Query(ctx, p.sql.poolsWithExpiredPermits)
	if err != nil {
		return 0, fmt.Errorf("admission: listing pools with expired permits: %w", err)
	}
	pools, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("admission: listing pools with expired permits: %w", err)
	}
	var total int64
	for _, pool := range pools {
		var n int64
		err := db.QueryRow(ctx, p.sql.reapPermits, pool).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) { // reaped meanwhile by a grant cycle
			continue
		}
		if err != nil {
			return total, fmt.Errorf("admission: reaping pool %q: %w", pool, err)
		}
		total += n
	}
	return total, nil
}

// MaxReapBatch bounds the permits one ReapExpiredBatch call deletes.
const MaxReapBatch = 10_000

// ReapExpiredBatch reaps one batch: up to limit expired permits of the
// first pool, by name, after the pool named after ("" for the first),
// handing their slots back, and returns that pool's name ("" when no pool
// after it holds expired permits) and how many permits it reaped. It
// locks that one pool's row until the caller's transaction ends, so a
// maintenance service reaps every pool in short transactions, one pool
// each, instead of all in one: call it again with the same after while a
// batch reaps limit permits (the pool may hold more), then with the pool
// returned, until the pool returned is "".
func (p *Pruner) ReapExpiredBatch(ctx context.Context, db DBTX, after string, limit int) (pool string, reaped int64, err error) {
	if limit < 1 || limit > MaxReapBatch {
		return "", 0, fmt.Errorf("admission: reaping: limit is %d; use 1 to %d", limit, MaxReapBatch)
	}
	var name *string
	var handed int64
	if err := db.QueryRow(ctx, p.sql.reapExpiredBatch, limit, after).Scan(&name, &reaped, &handed); err != nil {
		return "", 0, fmt.Errorf("admission: reaping expired permits: %w", err)
	}
	return dbsql.Deref(name), reaped, nil
}

// CountExpired returns how many permits have expired unreaped, and when the
// oldest permit still held was acquired (the zero time when none is).
func (p *Pruner) CountExpired(ctx context.Context, db DBTX) (int64, time.Time, error) {
	var n int64
	var oldest *time.Time
	if err := db.QueryRow(ctx, p.sql.countExpiredPermits).Scan(&n, &oldest); err != nil {
		return 0, time.Time{}, fmt.Errorf("admission: counting expired permits: %w", err)
	}
	return n, dbsql.Deref(oldest), nil
}
