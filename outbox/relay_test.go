package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// drain receives messages on the "orders" topic until want distinct ids
// arrived, acking each, and returns them in arrival order (duplicates
// included).
func drain(t *testing.T, b *memory.Broker, want int) []broker.Message {
	t.Helper()
	c := b.Consumer("orders")
	defer func() { _ = c.Close() }()
	seen := map[string]bool{}
	var got []broker.Message
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for len(seen) < want {
		d, err := c.Receive(ctx)
		require.NoError(t, err, "received %d of %d distinct messages", len(seen), want)
		got = append(got, d.Message())
		seen[d.Message().ID] = true
		require.NoError(t, d.Ack(ctx))
	}
	return got
}

// refusingFirstAttempts is a memory broker that refuses, at random
// (seeded), about a third of the messages it is first given, and
// accepts every retry.
func refusingFirstAttempts(seed1, seed2 uint64) *memory.Broker {
	rng := rand.New(rand.NewPCG(seed1, seed2))
	var mu sync.Mutex
	tried := map[string]bool{}
	return memory.New(memory.Config{FailPublish: func(m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		first := !tried[m.ID]
		tried[m.ID] = true
		if first && rng.Float64() < 0.3 {
			return errors.New("injected: broker refused")
		}
		return nil
	}})
}

// requireKeyOrder checks that the messages of each key, whose bodies are
// {"n": N} with N growing in write order, arrived in that order.
func requireKeyOrder(t *testing.T, msgs []broker.Message) {
	t.Helper()
	last := map[string]int{}
	for _, m := range msgs {
		var body struct{ N int }
		require.NoError(t, json.Unmarshal(m.Body, &body))
		if prev, ok := last[m.Key]; ok && m.Key != "" {
			require.Greater(t, body.N, prev, "key %s out of order", m.Key)
		}
		last[m.Key] = body.N
	}
}

type relayFixture struct {
	db    *dbtest.DB
	store *outbox.Store
}

// pending counts the unpublished events.
func (f relayFixture) pending(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE published_at IS NULL").Scan(&n))
	return n
}

func setupRelay(t *testing.T) relayFixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 16})
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	return relayFixture{db: db, store: store}
}

func (f relayFixture) runRelay(t *testing.T, pub broker.Publisher, cfg outbox.RelayConfig) (*outbox.Relay, func()) {
	t.Helper()
	r, err := f.store.NewRelay(f.db.Pool, pub, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(stop)
	return r, stop
}

// 10,000 events from 8 concurrent writers, 3 relays: every event is
// published, events sharing a key arrive in write order, and every row is
// marked published.
func TestRelayPublishesEverythingInKeyOrder(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	const writers, perWriter, keys = 8, 1250, 40
	for i := range 3 {
		f.runRelay(t, b.Publisher(), outbox.RelayConfig{ID: fmt.Sprintf("relay-%d", i), PollInterval: 20 * time.Millisecond})
	}

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				key := fmt.Sprintf("key-%d", (w*perWriter+i)%keys)
				// Writers of one key serialise on a row lock, as a job's
				// transitions do on the job row: write order is commit order.
				err := pgx.BeginFunc(t.Context(), f.db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(t.Context(), "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
						return err
					}
					_, err := f.store.Write(t.Context(), tx, outbox.Event{
						Topic: "orders", Key: key, Type: "order.changed",
						Payload: json.RawMessage(fmt.Sprintf(`{"writer":%d,"n":%d}`, w, i)),
					})
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	got := drain(t, b, writers*perWriter)
	// Per key, the first deliveries of each id must follow write order (seq).
	var seqOf = map[string]int64{}
	rows, err := f.db.Pool.Query(t.Context(), "SELECT event_id::text, seq FROM "+f.db.Schema+".outbox")
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var seq int64
		require.NoError(t, rows.Scan(&id, &seq))
		seqOf[id] = seq
	}
	require.NoError(t, rows.Err())
	last := map[string]int64{}
	firstSeen := map[string]bool{}
	for _, m := range got {
		if firstSeen[m.ID] {
			continue // a redelivery: at-least-once
		}
		firstSeen[m.ID] = true
		require.Greater(t, seqOf[m.ID], last[m.Key], "key %s out of order", m.Key)
		last[m.Key] = seqOf[m.ID]
		require.Equal(t, m.ID, m.Headers[outbox.HeaderEventID])
		require.Equal(t, "order.changed", m.Headers[outbox.HeaderEventType])
	}
	require.Len(t, firstSeen, writers*perWriter)
	require.Eventually(t, func() bool { return f.pending(t) == 0 }, 10*time.Second, 20*time.Millisecond, "published_at set for all")
	require.Equal(t, writers*perWriter, b.Published("orders"), "without injected crashes, nothing was published twice")
}

// blockingPublisher confirms to the broker and then hangs, like a relay
// process that dies between the broker's confirm and recording it.
type blockingPublisher struct {
	broker.Publisher
	published chan struct{}
}

func (p *blockingPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if err := p.Publisher.Publish(ctx, msgs); err != nil {
		return err
	}
	close(p.published)
	<-ctx.Done()
	return ctx.Err()
}

// relayOnceLosingTheClaim runs RelayOnce with a relay configured by cfg,
// which "dies" once the broker confirmed rec: its claim passes to another
// relay and its context ends, so its verdict is settled against a claim
// that is no longer its own.
func (f relayFixture) relayOnceLosingTheClaim(t *testing.T, b *memory.Broker, rec outbox.Record, cfg outbox.RelayConfig) {
	t.Helper()
	dying := &blockingPublisher{Publisher: b.Publisher(), published: make(chan struct{})}
	r, err := f.store.NewRelay(f.db.Pool, dying, cfg)
	require.NoError(t, err)
	ctx, kill := context.WithCancel(t.Context())
	go func() {
		<-dying.published
		_, _ = f.db.Pool.Exec(context.Background(), "UPDATE "+f.db.Schema+".outbox SET claimed_by = 'someone-else' WHERE event_id = $1", rec.ID)
		kill()
	}()
	_, _ = r.RelayOnce(ctx)
}

// A relay dies after the broker confirmed but before it marked the event
// published: after its claim lease, another relay publishes the event again
// (at-least-once), and the inbox downstream accepts it once.
func TestRelayCrashAfterConfirmRepublishes(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	rec, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: "o-1", Type: "order.placed", Payload: json.RawMessage(`{"id":1}`)})
	require.NoError(t, err)

	f.relayOnceLosingTheClaim(t, b, rec, outbox.RelayConfig{ID: "dying", ClaimLease: time.Second})
	require.Equal(t, 1, f.pending(t), "the confirmed event was not recorded as published")

	_, err = f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox SET claimed_until = now() - interval '1 second' WHERE event_id = $1", rec.ID)
	require.NoError(t, err)
	second, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{ID: "successor"})
	require.NoError(t, err)
	res, err := second.RelayOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	require.Zero(t, f.pending(t))

	msgs := drain(t, b, 1)
	if len(msgs) < 2 {
		msgs = append(msgs, drain(t, b, 1)...)
	}
	require.Len(t, msgs, 2, "published twice")
	in, err := inbox.NewStore(inbox.Config{Schema: f.db.Schema})
	require.NoError(t, err)
	var results []inbox.Result
	for _, m := range msgs {
		r, err := in.Accept(t.Context(), f.db.Pool, "erp", m, broker.Source{Queue: "orders"})
		require.NoError(t, err)
		results = append(results, r)
	}
	require.Equal(t, []inbox.Result{inbox.NewMessage, inbox.Duplicate}, results, "accepted once")
}

// A publisher that fails 30 % of messages: nothing is lost, failures are
// retried with backoff, and healthy events are not held behind them.
func TestRelayRetriesFailuresWithoutBlockingOthers(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	var attempts sync.Map // event id → *atomic.Int32
	rng := rand.New(rand.NewPCG(1, 2))
	var rngMu sync.Mutex
	b := memory.New(memory.Config{FailPublish: func(m broker.Message) error {
		n, _ := attempts.LoadOrStore(m.ID, new(atomic.Int32))
		counter, _ := n.(*atomic.Int32)
		first := counter.Add(1) == 1
		rngMu.Lock()
		fail := first && rng.Float64() < 0.3
		rngMu.Unlock()
		if fail {
			return errors.New("injected: broker refused")
		}
		return nil
	}})
	const events = 500
	for i := range events {
		_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Type: "order.placed", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		require.NoError(t, err)
	}
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{
		Backoff: llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: 100 * time.Millisecond},
	})
	require.NoError(t, err)

	res, err := r.RelayOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 100, res.Claimed)
	require.Positive(t, res.Failed)
	failedFirst := 0
	for res.Claimed > 0 { // the healthy events go out without waiting for the failed ones
		failedFirst += res.Failed
		res, err = r.RelayOnce(t.Context())
		require.NoError(t, err)
	}
	failedFirst += res.Failed
	require.InDelta(t, 0.3*events, failedFirst, 0.1*events)
	var healthyWaiting int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+f.db.Schema+".outbox WHERE last_error IS NULL AND published_at IS NULL").Scan(&healthyWaiting))
	require.Zero(t, healthyWaiting, "no event that did not fail waited behind the failed ones")

	require.Eventually(t, func() bool {
		_, err := r.RelayOnce(t.Context())
		require.NoError(t, err)
		return f.pending(t) == 0
	}, 10*time.Second, 20*time.Millisecond, "the failed events are retried after their backoff")
	var withErrors int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE last_error LIKE '%injected: broker refused%' AND attempts = 2").Scan(&withErrors))
	require.Equal(t, failedFirst, withErrors, "each failed event records its error and its second attempt")
	require.Equal(t, events, b.Published("orders"))

	st, err := r.Stats(t.Context())
	require.NoError(t, err)
	require.Zero(t, st.Pending)
	require.Equal(t, int64(events), st.Published)
	require.Equal(t, int64(failedFirst), st.Failed)
}

// Publish failures must not reorder a key: with small batches, few keys
// and a third of first attempts refused, every key's events still reach the
// broker in write order, whether batches are relayed one at a time
// (RelayOnce) or overlapping (Drain, which claims the next batch while one
// is published). (Two ways this went wrong before: a later event of a key
// confirmed in the same call as a refused earlier one, and a later event
// claimed while an earlier one, due again, sat below the claim's starting
// seq.)
func TestRelayKeepsKeyOrderThroughFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		keys, batch int
		relay       func(context.Context, *outbox.Relay) error
	}{
		{"RelayOnce", 8, 50, func(ctx context.Context, r *outbox.Relay) error { _, err := r.RelayOnce(ctx); return err }},
		{"Drain", 64, 16, func(ctx context.Context, r *outbox.Relay) error { _, err := r.Drain(ctx); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setupRelay(t)
			b := refusingFirstAttempts(3, 4)
			const events = 400
			for i := range events {
				_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{
					Topic: "orders", Key: fmt.Sprintf("key-%d", i%tc.keys), Type: "order.changed",
					Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
				})
				require.NoError(t, err)
			}
			r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{
				BatchSize: tc.batch,
				Backoff:   llmqtype.BackoffPolicy{Base: 5 * time.Millisecond, Cap: 10 * time.Millisecond},
			})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				require.NoError(t, tc.relay(t.Context(), r))
				return f.pending(t) == 0
			}, 30*time.Second, time.Millisecond)

			requireKeyOrder(t, drain(t, b, events))
		})
	}
}

// overlapProbe publishes through the memory broker and, while it holds a
// batch that is not the last, waits for the relay to claim events of
// another batch: evidence that claiming overlaps publishing.
type overlapProbe struct {
	broker.Publisher
	f                   relayFixture
	total               int
	published, overlaps int
	missed              bool // a wait timed out: do not wait again
}

func (p *overlapProbe) Publish(ctx context.Context, msgs []broker.Message) error {
	if err := p.Publisher.Publish(ctx, msgs); err != nil {
		return err
	}
	p.published += len(msgs) // Publish calls of one relay never overlap
	if p.published == p.total || p.missed {
		return nil
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for wait.Err() == nil {
		var others int
		err := p.f.db.Pool.QueryRow(wait, "SELECT count(*) FROM "+p.f.db.Schema+".outbox WHERE published_at IS NULL AND claimed_until > now() AND NOT event_id::text = ANY ($1)", ids).Scan(&others)
		if err == nil && others > 0 {
			p.overlaps++
			return nil
		}
		time.Sleep(time.Millisecond) // polling the database for a condition it cannot signal
	}
	p.missed = true
	return nil
}

// Drain claims the next batch while the previous one is being published,
// and still publishes every key in write order and marks every event.
func TestDrainClaimsWhilePublishing(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	const events, keys, batch = 300, 100, 25
	for i := range events {
		_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{
			Topic: "orders", Key: fmt.Sprintf("key-%d", i%keys), Type: "order.changed",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		})
		require.NoError(t, err)
	}
	probe := &overlapProbe{Publisher: b.Publisher(), f: f, total: events}
	r, err := f.store.NewRelay(f.db.Pool, probe, outbox.RelayConfig{BatchSize: batch})
	require.NoError(t, err)

	res, err := r.Drain(t.Context())
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: events, Published: events}, res)
	require.Zero(t, f.pending(t), "the last verdict is recorded before Drain returns")
	require.Equal(t, events/batch-1, probe.overlaps, "every batch but the last was published while the next was claimed")

	last := map[string]int{}
	for _, m := range drain(t, b, events) {
		var body struct{ N int }
		require.NoError(t, json.Unmarshal(m.Body, &body))
		if prev, ok := last[m.Key]; ok {
			require.Greater(t, body.N, prev, "key %s out of order", m.Key)
		}
		last[m.Key] = body.N
	}
	require.Equal(t, events, b.Published("orders"))
}

// Trace context travels with the message; the backlog's age is reported as
// the publication lag; published events are pruned after the retention and
// unpublished ones never are.
func TestRelayHeadersLagAndPruning(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{Retention: time.Hour})
	require.NoError(t, err)

	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	old, err := f.store.Write(ctx, f.db.Pool, outbox.Event{Topic: "orders", Type: "order.placed",
		Payload: json.RawMessage(`{}`), Headers: map[string]string{"traceparent": traceparent}})
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox SET created_at = now() - interval '90 seconds'")
	require.NoError(t, err)

	st, err := r.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Pending)
	require.InDelta(t, 90, st.OldestPending.Seconds(), 30, "the lag is the oldest unpublished event's age")

	_, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	msg := drain(t, b, 1)[0]
	require.Equal(t, traceparent, msg.Headers["traceparent"])
	st, err = r.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Pending)
	require.Zero(t, st.OldestPending)

	// One published event past the retention, one published recently, one
	// never published (and old).
	recent, err := f.store.Write(ctx, f.db.Pool, outbox.Event{Topic: "orders", Type: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	_, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	stuck, err := f.store.Write(ctx, f.db.Pool, outbox.Event{Topic: "orders", Type: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox SET published_at = now() - interval '2 hours' WHERE event_id = $1", old.ID)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox SET created_at = now() - interval '2 days' WHERE event_id = $1", stuck.ID)
	require.NoError(t, err)

	n, err := r.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	rows, err := f.db.Pool.Query(ctx, "SELECT event_id FROM "+f.db.Schema+".outbox ORDER BY seq")
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	require.NoError(t, err)
	require.Equal(t, [][16]byte{recent.ID, stuck.ID}, left, "only the event published longer ago than the retention is gone")
}

// cancellingPublisher confirms every batch, and cancels the relay's
// context while it publishes batch number cancelAt.
type cancellingPublisher struct {
	broker.Publisher
	cancelAt, calls int
	cancel          context.CancelFunc
}

func (p *cancellingPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	p.calls++
	if p.calls == p.cancelAt {
		p.cancel()
		return p.Publisher.Publish(context.WithoutCancel(ctx), msgs)
	}
	return p.Publisher.Publish(ctx, msgs)
}

// Drain stopped mid-stream, while the next claim may be running, still
// records every batch the broker confirmed: nothing confirmed is left to be
// published again.
func TestDrainRecordsConfirmedBatchesWhenStopped(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	const events = 200
	for i := range events {
		_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{
			Topic: "orders", Key: fmt.Sprintf("key-%d", i), Type: "order.changed",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pub := &cancellingPublisher{Publisher: b.Publisher(), cancelAt: 3, cancel: cancel}
	r, err := f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{BatchSize: 20})
	require.NoError(t, err)

	res, err := r.Drain(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.GreaterOrEqual(t, res.Published, 60, "three batches were confirmed")
	var marked int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE published_at IS NOT NULL").Scan(&marked))
	require.Equal(t, b.Published("orders"), marked, "every confirmed event is marked published")
	require.Equal(t, res.Published, marked)
	st, err := r.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(marked), st.Published)
}

// With DeletePublished, a confirmed event is deleted instead of marked:
// every event is still published, each key's first deliveries come in
// write order through failed publications, an event the broker refused
// stays until it is confirmed, and a verdict whose claim another relay
// took deletes nothing.
func TestDeletePublishedKeepsEveryGuarantee(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	var refusals atomic.Int32
	b := memory.New(memory.Config{FailPublish: func(m broker.Message) error {
		// Publications of events 0 and 3 of any key are refused, ten
		// times in all.
		if n, err := strconv.Atoi(m.Headers["n"]); err == nil && n%3 == 0 && refusals.Add(1) <= 10 {
			return errors.New("injected: broker refused")
		}
		return nil
	}})
	const keys, perKey = 5, 6
	for i := range perKey {
		for k := range keys {
			_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{
				Topic: "orders", Key: fmt.Sprintf("key-%d", k), Type: "order.changed",
				Headers: map[string]string{"n": strconv.Itoa(i)}, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			})
			require.NoError(t, err)
		}
	}
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{
		DeletePublished: true, BatchSize: 7,
		Backoff: llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: 5 * time.Millisecond},
	})
	require.NoError(t, err)

	res, err := r.RelayOnce(t.Context())
	require.NoError(t, err)
	require.Positive(t, res.Failed, "some publications were refused")
	var left, failed int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(),
		"SELECT count(*), count(*) FILTER (WHERE last_error LIKE '%injected%') FROM "+f.db.Schema+".outbox").Scan(&left, &failed))
	require.Equal(t, keys*perKey-res.Published, left, "each confirmed event is deleted at once, and only those")
	require.Equal(t, res.Failed, failed, "a refused event stays, with its error")

	require.Eventually(t, func() bool {
		_, err := r.RelayOnce(t.Context())
		require.NoError(t, err)
		return f.pending(t) == 0
	}, 10*time.Second, 5*time.Millisecond, "every event is published in the end")
	require.Zero(t, count(t, f.db.Pool, f.db.Schema), "nothing published is kept")

	firsts := map[string][]string{}
	seen := map[string]bool{}
	for _, m := range drain(t, b, keys*perKey) {
		if !seen[m.ID] {
			seen[m.ID] = true
			firsts[m.Key] = append(firsts[m.Key], m.Headers["n"])
		}
	}
	for k, order := range firsts {
		require.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, order, "key %s in write order", k)
	}

	// A verdict on a claim another relay took deletes nothing.
	rec, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: "o-1", Type: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	f.relayOnceLosingTheClaim(t, b, rec, outbox.RelayConfig{ID: "dying", DeletePublished: true})
	require.Equal(t, 1, f.pending(t), "the event whose claim was taken is still there")
}

// A claim takes no row lock before its update: one that meets an event a
// late verdict is marking (a relay whose claim ran out, settling) waits
// for that verdict, and then skips the event it published, instead of
// publishing it again.
func TestClaimWaitingForAVerdictSkipsWhatItPublished(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	rec, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: "o-1", Type: "order.placed", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox SET claimed_by = 'late', claimed_until = now() - interval '1 second', attempts = 1 WHERE event_id = $1", rec.ID)
	require.NoError(t, err)

	verdict, err := f.db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = verdict.Rollback(context.Background()) }()
	_, err = verdict.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox SET published_at = now(), claimed_by = NULL, claimed_until = NULL WHERE event_id = $1 AND claimed_by = 'late'", rec.ID)
	require.NoError(t, err)
	var verdictPID int32
	require.NoError(t, verdict.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&verdictPID))

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	// Long enough that the claim waits for the verdict and does not give
	// up on it (see TestARowHeldElsewhereHoldsBackOnlyItsEvent).
	outbox.SetClaimLockTimeout(r, time.Minute)
	type result struct {
		res outbox.BatchResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.RelayOnce(t.Context())
		done <- result{res, err}
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, f.db.Pool.QueryRow(t.Context(),
			"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))", verdictPID).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the claim waits for the verdict's row")
	require.NoError(t, verdict.Commit(t.Context()))

	got := <-done
	require.NoError(t, got.err)
	require.Zero(t, got.res.Claimed, "the event the verdict published is not claimed again")
	require.Zero(t, b.Published("orders"))
	require.Zero(t, f.pending(t))
}

// A session of someone else's holding the row of an unpublished event (an
// operator's open transaction) holds back that event and the later ones of
// its key, and nothing else: the lock-free claim gives up waiting for the
// row and the relay claims skipping locked rows.
func TestARowHeldElsewhereHoldsBackOnlyItsEvent(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	const keys = 5
	var held outbox.Record
	for i := range 2 {
		for k := range keys {
			rec, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Key: fmt.Sprintf("key-%d", k), Type: "order.changed",
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
			require.NoError(t, err)
			if i == 0 && k == 0 {
				held = rec
			}
		}
	}
	operator, err := f.db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = operator.Rollback(context.Background()) }()
	_, err = operator.Exec(t.Context(), "SELECT FROM "+f.db.Schema+".outbox WHERE event_id = $1 FOR UPDATE", held.ID)
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.Drain(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2*keys-2, res.Published, "everything but the held event and the next of its key")
	require.Equal(t, 2, f.pending(t))

	require.NoError(t, operator.Rollback(t.Context()))
	res, err = r.Drain(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, res.Published, "once the row is free, its key goes on in order")
	var order []string
	for _, m := range drain(t, b, 2*keys) {
		if m.Key == "key-0" {
			order = append(order, string(m.Body))
		}
	}
	require.Equal(t, []string{`{"n": 0}`, `{"n": 1}`}, order)
}
