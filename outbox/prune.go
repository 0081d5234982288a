package outbox

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"time"

	"github.com/llmq/llmq/internal/dbsql"
)

//go:embed prune.sql
var pruneSQL string

// MaxPruneBatch bounds the events one Pruner call deletes.
const MaxPruneBatch = 10_000

// Pruner deletes published events past their retention without a relay,
// for hosts that run none (or to prune on a schedule of their own). It
// runs the relay's own statement, so relays and pruners may run at once.
// It holds no connections and is safe for concurrent use.
type Pruner struct {
	schema string
	sql    statements
}

// NewPruner prepares the pruner's SQL for schema ("" is the default
// schema).
func NewPruner(schema string) (*Pruner, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	p := &Pruner{schema: s.Name()}
	if _, err := p.sql.load(s); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return p, nil
}

// PruneResult is what one PrunePublished or PruneUnrelayed call deleted.
type PruneResult struct {
	// Events counts the events deleted, a batch row's (Store.WriteBatch)
	// by its events.
	Events int64
	// More is true when a limit was reached: there may be more to prune.
	More bool
}

// PrunePublished deletes up to limit events and up to limit batch rows
// (Store.WriteBatch) published more than olderThan ago, oldest first.
// Call it again while the result says More: the event count cannot tell,
// since a batch row holds any number of events.
func (p *Pruner) PrunePublished(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (PruneResult, error) {
	if err := checkPrune(olderThan, limit); err != nil {
		return PruneResult{}, err
	}
	var r PruneResult
	if err := db.QueryRow(ctx, p.sql.prunePublished, olderThan.Milliseconds(), limit).Scan(&r.Events, &r.More); err != nil {
		return PruneResult{}, fmt.Errorf("outbox: pruning published events: %w", p.explain(err))
	}
	return r, nil
}

// PruneUnrelayed deletes up to limit unpublished events and up to limit
// batch rows written more than olderThan ago, for hosts that run no relay
// and leave their events to retention (as PrunePublished). It deletes
// nothing on a schema where a relay has ever held the leader lease: a
// relay that stopped or is restarting must find its events.
func (p *Pruner) PruneUnrelayed(ctx context.Context, db DBTX, olderThan time.Duration, limit int) (PruneResult, error) {
	if err := checkPrune(olderThan, limit); err != nil {
		return PruneResult{}, err
	}
	var r PruneResult
	if err := db.QueryRow(ctx, p.sql.pruneUnrelayed, olderThan.Milliseconds(), limit).Scan(&r.Events, &r.More); err != nil {
		return PruneResult{}, fmt.Errorf("outbox: pruning unrelayed events: %w", p.explain(err))
	}
	return r, nil
}

// CountPublished counts the events PrunePublished would delete with no
// limit.
func (p *Pruner) CountPublished(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	if err := checkPrune(olderThan, 1); err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, p.sql.countPublished, olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting published events: %w", p.explain(err))
	}
	return n, nil
}

// CountUnrelayed counts the events PruneUnrelayed would delete with no
// limit (none on a schema where a relay has ever run).
func (p *Pruner) CountUnrelayed(ctx context.Context, db DBTX, olderThan time.Duration) (int64, error) {
	if err := checkPrune(olderThan, 1); err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, p.sql.countUnrelayed, olderThan.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting unrelayed events: %w", p.explain(err))
	}
	return n, nil
}

// Backlog counts unpublished events, up to limit (capped is true when
// there are at least limit), and returns the oldest one's age: the
// relay's lag where one runs, at a cost bounded by limit where the
// backlog is large (a host with no relay keeps every event until
// retention deletes it).
func (p *Pruner) Backlog(ctx context.Context, db DBTX, limit int) (n int64, capped bool, oldest time.Duration, err error) {
	if limit < 1 {
		return 0, false, 0, fmt.Errorf("outbox: backlog: limit is %d; use a positive limit", limit)
	}
	var seconds float64
	if err := db.QueryRow(ctx, p.sql.countUnpublishedUpTo, limit).Scan(&n, &seconds); err != nil {
		return 0, false, 0, fmt.Errorf("outbox: counting the unpublished backlog: %w", p.explain(err))
	}
	return n, n >= int64(limit), time.Duration(seconds * float64(time.Second)), nil
}

// Oldest returns when the oldest published event was published and when
// the oldest unpublished one was written; the zero time for none.
func (p *Pruner) Oldest(ctx context.Context, db DBTX) (published, unpublished time.Time, err error) {
	var pub, unpub *time.Time
	if err := db.QueryRow(ctx, p.sql.oldestEvents).Scan(&pub, &unpub); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("outbox: reading the oldest events: %w", p.explain(err))
	}
	return dbsql.Deref(pub), dbsql.Deref(unpub), nil
}

// RelayLeaseState is the relays' leader lease as operators see it.
type RelayLeaseState struct {
	Holder     string    // "" when free
	LeaseUntil time.Time // the holder's lease runs until then
	// Acquisitions counts the times a relay took the lease: 0 means no
	// relay ever ran on this schema, so unpublished events are not lag.
	Acquisitions int64
}

// RelayLease reads the relays' leader lease.
func (p *Pruner) RelayLease(ctx context.Context, db DBTX) (RelayLeaseState, error) {
	var s RelayLeaseState
	var until *time.Time // NULL: never held, or released
	if err := db.QueryRow(ctx, p.sql.relayLease).Scan(&s.Holder, &until, &s.Acquisitions); err != nil {
		return s, fmt.Errorf("outbox: reading the relay lease: %w", p.explain(err))
	}
	s.LeaseUntil = dbsql.Deref(until)
	return s, nil
}

// explain turns an undefined-table error into a
// *llmqtype.NotMigratedError naming the pruner's schema (see
// dbsql.Explain).
func (p *Pruner) explain(err error) error {
	return dbsql.Explain(err, p.schema, "the schema given to outbox.NewPruner")
}

func checkPrune(olderThan time.Duration, limit int) error {
	switch {
	case olderThan <= 0:
		return fmt.Errorf("outbox: pruning: olderThan is %s; it must be positive", olderThan)
	case olderThan.Milliseconds() > math.MaxInt64/2:
		return fmt.Errorf("outbox: pruning: olderThan %s is too long", olderThan)
	case limit < 1 || limit > MaxPruneBatch:
		return fmt.Errorf("outbox: pruning: limit is %d; use 1 to %d", limit, MaxPruneBatch)
	}
	return nil
}
