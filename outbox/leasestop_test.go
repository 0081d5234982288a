package outbox_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/outbox"
)

// cancelAfterAcquire cancels its context when the transaction that took
// the leader lease has committed: Run's context ends right after it
// acquired.
type cancelAfterAcquire struct {
	cancel   context.CancelFunc
	acquired atomic.Bool
}

type traceSQL struct{}

func (c *cancelAfterAcquire) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceSQL{}, data.SQL)
}

func (c *cancelAfterAcquire) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(traceSQL{}).(string)
	switch {
	case data.Err != nil:
	case strings.Contains(sql, "lease_epoch = l.lease_epoch + 1"):
		c.acquired.Store(true)
	case strings.EqualFold(sql, "commit") && c.acquired.Load():
		c.cancel()
	}
}

// A relay whose context ends right after it took the lease still releases
// it, instead of leaving it held for a whole LeaderLease.
func TestRunStoppedRightAfterAcquiringReleasesTheLease(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tracer := &cancelAfterAcquire{cancel: cancel}
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	r, err := f.store.NewRelay(pool, memory.New(memory.Config{}).Publisher(), outbox.RelayConfig{ID: "stopping"})
	require.NoError(t, err)
	require.NoError(t, r.Run(ctx))
	require.True(t, tracer.acquired.Load(), "the relay took the lease")
	var holder string
	var released bool
	require.NoError(t, f.db.Pool.QueryRow(t.Context(),
		"SELECT holder, lease_until = '-infinity' FROM "+f.db.Schema+".outbox_relay_lease").Scan(&holder, &released))
	require.Equal(t, "stopping", holder)
	require.True(t, released, "the lease it took is released when Run returns")
}
