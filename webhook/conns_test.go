package webhook_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// countingDB is a DBTX that counts the connections checked out through it
// at once, and the most ever: a statement holds one while it runs, a row
// until it is scanned, a transaction until it ends.
type countingDB struct {
	webhook.DBTX
	cur, peak atomic.Int64
}

func (c *countingDB) take() func() {
	n := c.cur.Add(1)
	for {
		p := c.peak.Load()
		if n <= p || c.peak.CompareAndSwap(p, n) {
			break
		}
	}
	var once sync.Once
	return func() { once.Do(func() { c.cur.Add(-1) }) }
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	defer c.take()()
	return c.DBTX.Exec(ctx, sql, args...)
}

// Query refuses: an attempt runs no multi-row query (only the breaker
// gauge does, and this test has none), and one added must be counted here.
func (c *countingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("countingDB: Query is not counted")
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &countedRow{row: c.DBTX.QueryRow(ctx, sql, args...), done: c.take()}
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	done := c.take()
	tx, err := c.DBTX.Begin(ctx)
	if err != nil {
		done()
		return nil, err
	}
	return &countedTx{Tx: tx, done: done}, nil
}

type countedRow struct {
	row  pgx.Row
	done func()
}

func (r *countedRow) Scan(dest ...any) error { defer r.done(); return r.row.Scan(dest...) }

type countedTx struct {
	pgx.Tx
	done func()
}

func (t *countedTx) Commit(ctx context.Context) error   { defer t.done(); return t.Tx.Commit(ctx) }
func (t *countedTx) Rollback(ctx context.Context) error { defer t.done(); return t.Tx.Rollback(ctx) }

// However many deliveries the runner has in flight, the dispatcher uses at
// most MaxConns database connections at once: here eight deliveries to eight
// endpoints are answered together, so their records would all run at the
// same moment.
func TestDispatcherUsesAtMostMaxConns(t *testing.T) {
	t.Parallel()
	const n = 8
	f := setup(t)
	var arrived atomic.Int64
	all := make(chan struct{})
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	})
	for range n {
		f.register(srv)
	}
	deliveries := f.enqueue(webhook.Event{ID: "ev-1"})
	require.Len(t, deliveries, n, "one delivery per endpoint")
	db := &countingDB{DBTX: f.pool}
	d, err := f.store.NewDispatcher(db, webhook.DispatcherConfig{Client: f.client, MaxConns: 1})
	require.NoError(t, err)
	cfg := runnerConfig(map[string]lease.Handler{webhook.Kind: d})
	cfg.Queues = map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 1}, webhook.DefaultQueue: {MaxWorkers: n}}
	f.start(cfg)
	for _, dl := range deliveries {
		require.Equal(t, jobs.StateSucceeded, f.await(dl.JobID).State)
	}
	require.Equal(t, int64(1), db.peak.Load(), "one connection at a time, for %d deliveries in flight", n)
	require.Zero(t, db.cur.Load(), "none held after the work")
}

// Without a Logger the dispatcher and the receiver report through
// slog.Default(), never into a discard handler.
func TestLoggerDefaultsToSlogDefault(t *testing.T) {
	t.Parallel()
	f := setup(t)
	d := f.dispatcher(webhook.DispatcherConfig{})
	require.Same(t, slog.Default(), webhook.DispatcherLogger(d))
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{{ID: "k", Secret: webhook.NewSecret()}}})
	require.NoError(t, err)
	rc, err := webhook.NewReceiver(webhook.ReceiverConfig{
		Verifier: v, Inbox: f.inbox, DB: f.pool, Consumer: "c",
		Handle: func(context.Context, pgx.Tx, webhook.Received) error { return nil },
	})
	require.NoError(t, err)
	require.Same(t, slog.Default(), webhook.ReceiverLogger(rc))

	_, err = f.store.NewDispatcher(f.pool, webhook.DispatcherConfig{Client: f.client, MaxConns: -1})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
}
