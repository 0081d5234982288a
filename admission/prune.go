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
	pools, reap, count string
}

// NewPruner prepares the pruner's SQL for schema ("" is the default
// schema).
func NewPruner(schema string) (*Pruner, error) {
	_, q, err := dbsql.Prepare(schema, queriesSQL)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	_, pq, err := dbsql.Prepare(schema, pruneSQL)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	return &Pruner{reap: q.Must("ReapPermits"), pools: pq.Must("PoolsWithExpiredPermits"), count: pq.Must("CountExpiredPermits")}, nil
}

// ReapExpired deletes every expired permit, pool by pool, handing each
// pool's slots back in the same statement, and returns how many it
// deleted. A pool is one statement, but its row lock is held until the
// caller's transaction ends: a grant cycle of that pool waits for it, so
// run ReapExpired in a short transaction of its own.
func (p *Pruner) ReapExpired(ctx context.Context, db DBTX) (int64, error) {
	rows, err := db.Query(ctx, p.pools)
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
		err := db.QueryRow(ctx, p.reap, pool).Scan(&n)
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

// CountExpired returns how many permits have expired unreaped, and when the
// oldest permit still held was acquired (the zero time when none is).
func (p *Pruner) CountExpired(ctx context.Context, db DBTX) (int64, time.Time, error) {
	var n int64
	var oldest *time.Time
	if err := db.QueryRow(ctx, p.count).Scan(&n, &oldest); err != nil {
		return 0, time.Time{}, fmt.Errorf("admission: counting expired permits: %w", err)
	}
	return n, dbsql.Deref(oldest), nil
}
