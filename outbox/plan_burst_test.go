package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/outbox"
)

// A relay's connections keep each statement's plan until the table's
// statistics change. A relay that deletes what it publishes works on an
// outbox of a few rows while events trickle in, and there scanning the
// table is the cheapest plan for its claims and verdicts; kept while a
// burst fills the outbox, such a plan would read every waiting event for
// each batch. The relay's transactions turn sequential scans off for
// themselves, so a burst after a trickle is relayed through the indexes.
func TestARelayAfterATrickleMeetsABurstThroughItsIndexes(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	// The relay's own sessions, which report their statistics when they
	// end.
	relayPool, err := pgxpool.New(ctx, dbtest.URL())
	require.NoError(t, err)
	defer relayPool.Close()
	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(relayPool, b.Publisher(), outbox.RelayConfig{ID: "r", PollInterval: 5 * time.Millisecond, DeletePublished: true})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	stop := sync.OnceValue(func() error { cancel(); return <-done })
	defer func() { _ = stop() }()

	// Waiting reads the broker, not the outbox, whose scans are counted.
	published := func(n int) func() bool {
		return func() bool { return b.Published("orders") >= n }
	}
	write := func(n, from int) {
		tx, err := f.db.Pool.Begin(ctx)
		require.NoError(t, err)
		for i := range n {
			_, err = f.store.Write(ctx, tx, outbox.Event{Topic: "orders", Key: fmt.Sprintf("k-%d", (from+i)%500), Type: "t", Payload: json.RawMessage(`{}`)})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(ctx))
	}
	const trickle, burst = 20, 20_000
	for i := range trickle {
		write(1, i)
		require.Eventually(t, published(i+1), 10*time.Second, time.Millisecond)
	}
	for i := range burst / 1000 {
		write(1000, i*1000)
	}
	require.Eventually(t, published(trickle+burst), time.Minute, 10*time.Millisecond)
	require.NoError(t, stop())
	relayPool.Close()

	// Every event was deleted by the relay's sessions: once their deletes
	// are counted, so are their scans.
	scanned := dbtest.ScannedRows(t, f.db.Pool, f.db.Schema, "outbox", "n_tup_del", trickle+burst)
	t.Logf("the relay's sessions read %d rows of outbox by scanning it", scanned)
	require.Less(t, scanned, int64(burst), "the relay's statements scanned the outbox")
}
