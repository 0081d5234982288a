package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/pgcluster"
	"github.com/llmq/llmq/outbox"
)

// failedPasses counts the relay's log lines saying a pass failed.
type failedPasses struct {
	slog.Handler
	n *atomic.Int32
}

func (h failedPasses) Enabled(context.Context, slog.Level) bool { return true }

func (h failedPasses) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "outbox relay pass failed") {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h failedPasses) WithAttrs(attrs []slog.Attr) slog.Handler {
	return failedPasses{Handler: h.Handler.WithAttrs(attrs), n: h.n}
}

// endSessions has the server end every session of the relay's pool named
// name, as a restart or a failover does, and waits until they are gone.
func (f relayFixture) endSessions(t *testing.T, name string) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	var ended []int32
	require.NoError(t, f.db.Pool.QueryRow(ctx,
		"SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}') FROM pg_stat_activity WHERE application_name = $1",
		name).Scan(&ended))
	require.Eventually(t, func() bool {
		var left int
		err := f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1)", ended).Scan(&left)
		return err == nil && left == 0
	}, 10*time.Second, 5*time.Millisecond)
}

// runRelayOn is runRelay on a pool of the relay's own.
func (f relayFixture) runRelayOn(t *testing.T, pool *pgxpool.Pool, pub broker.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := f.store.NewRelay(pool, pub, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return r
}

// stoppingPublisher confirms its first call to the broker and, before it
// returns, stops the database.
type stoppingPublisher struct {
	broker.Publisher
	once    sync.Once
	stop    func(context.Context) error
	stopped chan error
}

func (p *stoppingPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	err := p.Publisher.Publish(ctx, msgs)
	p.once.Do(func() { p.stopped <- p.stop(context.WithoutCancel(ctx)) })
	return err
}

// The database stops for a second while a batch row the relay claimed is
// being published, so recording the broker's verdict fails for the
// connection: the relay keeps the verdict and records it once the
// database is back, and the events held behind the row are published at
// once, in key order and each once, not a ClaimLease (a minute) later.
func TestRelayKeepsAVerdictALostConnectionFailed(t *testing.T) {
	t.Parallel()
	cluster := pgcluster.New(t)
	db := dbtest.Setup(t, dbtest.Options{URL: cluster.URL(), MaxConns: 8})
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	f := relayFixture{db: db, store: store}
	ctx := t.Context()
	// A batch row of one event per key, then three events per key behind it.
	_, err = f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 10, func(i int) string { return fmt.Sprintf("key-%d", i%10) }))
	require.NoError(t, err)
	for i := 10; i < 40; i++ {
		_, err := f.store.Write(ctx, f.db.Pool, orderEvents(i, 1, func(i int) string { return fmt.Sprintf("key-%d", i%10) })[0])
		require.NoError(t, err)
	}

	b := memory.New(memory.Config{})
	var failed atomic.Int32
	pub := &stoppingPublisher{Publisher: b.Publisher(), stop: cluster.Stop, stopped: make(chan error, 1)}
	relayPool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	f.runRelayOn(t, relayPool, pub, outbox.RelayConfig{ID: "relay", ClaimLease: time.Minute, LeaderLease: 30 * time.Second,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(failedPasses{Handler: slog.DiscardHandler, n: &failed})})
	require.NoError(t, <-pub.stopped)
	time.Sleep(time.Second) // the outage
	require.NoError(t, cluster.Start(t.Context()))
	back := time.Now()
	got := drain(t, b, 40)
	require.Less(t, time.Since(back), 10*time.Second, "published long before the claim ran out")
	require.Positive(t, failed.Load(), "a pass failed while the database was down")
	requireKeyOrder(t, got)
	f.db.Pool.Reset() // its connections from before the stop
	require.Eventually(t, func() bool { return f.unpublished(t) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 40, b.Published("orders"), "the verdict was recorded: nothing was published twice")
}

// A relay holds claims it never heard of (as a claim whose commit reached
// the server and whose reply was lost with the connection leaves them):
// once a pass has failed for the connection, the relay releases its own
// claims, and their events, and those held behind them, are published at
// once, in key order, instead of a ClaimLease later. The batch row among
// them is published whole, not split out as a row whose publication hung.
func TestRelayReleasesItsClaimsAfterALostConnection(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	name := "relay-" + f.db.Schema
	pool := relayPool(t, name, time.Minute)
	ctx := t.Context()
	_, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 10, func(i int) string { return fmt.Sprintf("key-%d", i%10) }))
	require.NoError(t, err)
	for i := 10; i < 40; i++ {
		_, err := f.store.Write(ctx, f.db.Pool, orderEvents(i, 1, func(i int) string { return fmt.Sprintf("key-%d", i%10) })[0])
		require.NoError(t, err)
	}
	for _, table := range []string{"outbox_batches", "outbox"} {
		_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+"."+table+
			" SET claimed_by = 'relay', claimed_until = now() + interval '1 hour', attempts = attempts + 1 WHERE published_at IS NULL")
		require.NoError(t, err)
	}

	b := memory.New(memory.Config{})
	var failed atomic.Int32
	r := f.runRelayOn(t, pool, b.Publisher(), outbox.RelayConfig{ID: "relay", ClaimLease: time.Hour, LeaderLease: 30 * time.Second,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(failedPasses{Handler: slog.DiscardHandler, n: &failed})})
	require.Eventually(t, r.Active, 10*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // a few passes that claim nothing: every event is claimed
	require.Zero(t, b.Published("orders"))
	started := time.Now()
	require.Eventually(t, func() bool {
		f.endSessions(t, name)
		return failed.Load() > 0
	}, 10*time.Second, 50*time.Millisecond, "a pass fails on the ended sessions")
	got := drain(t, b, 40)
	require.Less(t, time.Since(started), 10*time.Second, "published long before the claims ran out")
	requireKeyOrder(t, got)
	require.Eventually(t, func() bool { return f.unpublished(t) == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 30, f.rows(t, "outbox"), "no event was split out of the batch row")
}
