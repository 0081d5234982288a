package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/outbox"
)

// A row of the dead leader's claims that another session holds (an
// operator's open transaction) does not hold up the takeover: the standby
// becomes active within LeaderLease + StandbyPoll, releases the claims it
// can, and publishes around the held event, which stays claimed by the dead
// relay and is published once its claim runs out and the row is free.
func TestTakeoverIsNotHeldUpByALockedRow(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	write := func(key string) outbox.Record {
		rec, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: key, Type: "x", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return rec
	}
	held, free := write("a"), write("b")
	_, err := f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox_relay_lease SET holder = 'dead', lease_epoch = 1, lease_until = now() - interval '1 second'")
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox SET claimed_by = 'dead', claimed_until = now() + interval '1 hour' WHERE event_id = ANY ($1)",
		dbsql.UUIDs([]uuid.UUID{held.ID, free.ID}))
	require.NoError(t, err)
	operator, err := f.db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = operator.Rollback(context.Background()) }()
	_, err = operator.Exec(t.Context(), "SELECT FROM "+f.db.Schema+".outbox WHERE event_id = $1 FOR UPDATE", held.ID)
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	const lease = time.Second
	started := time.Now()
	r, _ := f.runRelay(t, b.Publisher(), outbox.RelayConfig{ID: "standby", LeaderLease: lease, PollInterval: 20 * time.Millisecond})
	require.Eventually(t, r.Active, 10*time.Second, 5*time.Millisecond, "the standby takes over")
	require.Less(t, time.Since(started), 2*lease+time.Second, "within LeaderLease + StandbyPoll (and some slack)")
	require.Eventually(t, func() bool { return b.Published("orders") == 1 }, 10*time.Second, 5*time.Millisecond,
		"the released claim is published at once")
	// The verdict on the published event is recorded by the relay's next
	// transaction, after the broker confirmed it.
	require.Eventually(t, func() bool { return f.pending(t) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the published event is marked, the held one stays pending")
	var claimedBy string
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT claimed_by FROM "+f.db.Schema+".outbox WHERE event_id = $1", held.ID).Scan(&claimedBy))
	require.Equal(t, "dead", claimedBy, "the held row keeps the dead relay's claim")

	require.NoError(t, operator.Rollback(t.Context()))
	// Its claim runs out, as it does after ClaimLease.
	_, err = f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox SET claimed_until = now() - interval '1 second' WHERE event_id = $1", held.ID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.pending(t) == 0 }, 10*time.Second, 5*time.Millisecond, "the held event is published once free")
	require.Equal(t, 2, b.Published("orders"))
}
