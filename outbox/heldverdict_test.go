package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/outbox"
)

// lockingPublisher publishes, and once the broker confirmed its first
// message, has an operator's transaction take that event's row, so the
// verdict on it meets a row another session holds.
type lockingPublisher struct {
	broker.Publisher
	once sync.Once
	lock func(id string)
}

func (p *lockingPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if err := p.Publisher.Publish(ctx, msgs); err != nil {
		return err
	}
	p.once.Do(func() { p.lock(msgs[0].ID) })
	return nil
}

// lockingFirst wraps pub so that an operator's transaction, sent on the
// channel, holds the row of the first event it publishes.
func lockingFirst(t *testing.T, f relayFixture, pub broker.Publisher) (*lockingPublisher, <-chan pgx.Tx) {
	t.Helper()
	locked := make(chan pgx.Tx, 1)
	return &lockingPublisher{Publisher: pub, lock: func(id string) {
		operator, err := f.db.Pool.Begin(context.Background())
		require.NoError(t, err)
		t.Cleanup(func() { _ = operator.Rollback(context.Background()) }) // before the schema is dropped
		_, err = operator.Exec(context.Background(), "SELECT FROM "+f.db.Schema+".outbox WHERE event_id = $1 FOR UPDATE", id)
		require.NoError(t, err)
		locked <- operator
	}}, locked
}

// A verdict on an event whose row another session holds neither waits for
// it (holding the claims' lock, which would stop every relay) nor is lost:
// the relay goes on, other relays claim, and the verdict is recorded once
// the row is free, without publishing the event again.
func TestAVerdictOnAHeldRowWaitsForNothing(t *testing.T) {
	t.Parallel()
	for _, deletePublished := range []bool{false, true} {
		t.Run(fmt.Sprintf("DeletePublished=%v", deletePublished), func(t *testing.T) {
			t.Parallel()
			f := setupRelay(t)
			const events = 3
			for k := range events {
				_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: fmt.Sprintf("key-%d", k), Type: "x", Payload: json.RawMessage(`{}`)})
				require.NoError(t, err)
			}
			b := memory.New(memory.Config{})
			pub, locked := lockingFirst(t, f, b.Publisher())
			r, err := f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{BatchSize: 1, DeletePublished: deletePublished})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			res, err := r.Drain(ctx)
			require.NoError(t, err, "the verdict on the held row did not stop the relay")
			require.Equal(t, events, res.Published)
			operator := <-locked
			require.Equal(t, 1, f.pending(t), "the held event's verdict waits for its row")

			// Another relay claims beside it: the claims' lock is free.
			_, err = f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: "other", Type: "x", Payload: json.RawMessage(`{}`)})
			require.NoError(t, err)
			other, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
			require.NoError(t, err)
			res, err = other.RelayOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, res.Published)

			// Once the row is free, the kept verdict is recorded: the event
			// is not published again.
			require.NoError(t, operator.Rollback(t.Context()))
			res, err = r.Drain(ctx)
			require.NoError(t, err)
			require.Zero(t, res.Claimed)
			require.Zero(t, f.pending(t))
			require.Equal(t, events+1, b.Published("orders"), "nothing was published twice")
			st, err := r.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(events), st.Published, "the kept verdict counts once recorded")
		})
	}
}

// RelayOnce keeps a verdict it could not record for its next call.
func TestRelayOnceKeepsAVerdictOnAHeldRow(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: "k", Type: "x", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	b := memory.New(memory.Config{})
	pub, locked := lockingFirst(t, f, b.Publisher())
	r, err := f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	operator := <-locked
	require.Equal(t, 1, f.pending(t))

	require.NoError(t, operator.Rollback(t.Context()))
	res, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Claimed)
	require.Zero(t, f.pending(t))
	require.Equal(t, 1, b.Published("orders"))
}

// A key's next event waits while the verdict on its previous one is kept
// for a held row: the relay goes on with other keys, and publishes the
// next event of the held one's key only once that verdict is recorded, so
// the key's order holds.
func TestAKeptVerdictHoldsBackOnlyItsKey(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	var heldIDs []string
	for _, key := range []string{"held", "held", "free"} {
		rec, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: key, Type: "x", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		if key == "held" {
			heldIDs = append(heldIDs, rec.ID.String())
		}
	}
	b := memory.New(memory.Config{})
	pub, locked := lockingFirst(t, f, b.Publisher())
	r, err := f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{BatchSize: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published, "the held key's first event and the other key's")
	operator := <-locked
	require.Equal(t, 2, b.Published("orders"), "the held key's second event waits")

	require.NoError(t, operator.Rollback(t.Context()))
	res, err = r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	require.Zero(t, f.pending(t))
	c := b.Consumer("orders")
	var order []string
	for range 3 {
		d, err := c.Receive(ctx)
		require.NoError(t, err)
		if d.Message().Key == "held" {
			order = append(order, d.Message().ID)
		}
		require.NoError(t, d.Ack(ctx))
	}
	require.Equal(t, heldIDs, order, "the held key's events in write order")
}

// A claim is all or nothing, though it is sent as one batch of statements
// without BEGIN and COMMIT of its own: when its batch-row claim fails on a
// row another session holds, the single-event rows it had claimed in the
// same round trip are not left claimed. The relay's retry, skipping locked
// rows, takes and publishes them at once; had the first claim kept them,
// they would wait out the minute-long claim lease.
func TestAClaimThatFailsPartWayClaimsNothing(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	for _, key := range []string{"a", "b", "c"} {
		_, err := f.store.Write(ctx, f.db.Pool, outbox.Event{Topic: "orders", Key: key, Type: "x", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	_, err := f.store.WriteBatch(ctx, f.db.Pool, []outbox.Event{
		{Topic: "orders", Key: "d", Type: "x", Payload: json.RawMessage(`{}`)},
		{Topic: "orders", Key: "e", Type: "x", Payload: json.RawMessage(`{}`)},
	})
	require.NoError(t, err)
	operator, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = operator.Rollback(context.Background()) }()
	_, err = operator.Exec(ctx, "SELECT FROM "+f.db.Schema+".outbox_batches FOR UPDATE")
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{ClaimLease: time.Minute})
	require.NoError(t, err)
	res, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published, "the single events, claimed again by the retry: the failed claim kept none")
	require.Zero(t, f.pending(t))
}
