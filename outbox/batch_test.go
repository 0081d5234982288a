package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// unpublished counts the events waiting in both tables: single-event rows
// and the events of batch rows.
func (f relayFixture) unpublished(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), fmt.Sprintf(`
		SELECT (SELECT count(*) FROM %[1]s.outbox WHERE published_at IS NULL)
			+ (SELECT coalesce(sum(event_count), 0) FROM %[1]s.outbox_batches WHERE published_at IS NULL)`,
		f.db.Schema)).Scan(&n))
	return n
}

func (f relayFixture) rows(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+"."+table).Scan(&n))
	return n
}

func orderEvents(from, n int, key func(i int) string) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{Topic: "orders", Key: key(from + i), Type: "order.changed",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, from+i))}
	}
	return evs
}

// A batch is one row, written with the caller's transaction: rolled back,
// nothing is stored; committed, its events come back with their IDs and
// seqs in the order given, and the readers see each of them.
func TestWriteBatchStoresOneRowInTheTransaction(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	job := uuid.Must(uuid.NewV7())
	events := []outbox.Event{
		{AggregateID: job, Topic: "orders", Key: "k", Type: "order.placed", Payload: json.RawMessage(`{"n":1}`), Headers: map[string]string{"h": "v"}},
		{Topic: "orders", Type: "order.noted", Payload: json.RawMessage(`{"n":2}`)},
		{AggregateID: job, Topic: "orders", Key: "k", Type: "order.paid", Payload: json.RawMessage(`{"n":3}`)},
	}

	tx, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = f.store.WriteBatch(ctx, tx, events)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, f.rows(t, "outbox_batches"), "rolled back with the transaction")

	recs, err := f.store.WriteBatch(ctx, f.db.Pool, events)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	for i, rec := range recs {
		require.NotEqual(t, uuid.Nil, rec.ID)
		require.Equal(t, events[i].Type, rec.Type)
		require.False(t, rec.CreatedAt.IsZero())
		if i > 0 {
			require.Greater(t, rec.Seq, recs[i-1].Seq, "seqs follow the order given")
		}
	}
	require.Equal(t, 1, f.rows(t, "outbox_batches"))
	require.Zero(t, f.rows(t, "outbox"), "no single-event rows")

	listed, err := f.store.ListByAggregate(ctx, f.db.Pool, job)
	require.NoError(t, err)
	require.Len(t, listed, 2)
	for i, want := range []outbox.Record{recs[0], recs[2]} {
		require.Equal(t, want.ID, listed[i].ID)
		require.Equal(t, want.Seq, listed[i].Seq)
		require.Equal(t, job, listed[i].AggregateID)
		require.Equal(t, "k", listed[i].Key)
		require.JSONEq(t, string(want.Payload), string(listed[i].Payload))
		require.True(t, listed[i].PublishedAt.IsZero())
	}
	require.Equal(t, map[string]string{"h": "v"}, listed[0].Headers)

	r, err := f.store.NewRelay(f.db.Pool, memory.New(memory.Config{}).Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	st, err := r.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), st.Pending)

	one, err := f.store.WriteBatch(ctx, f.db.Pool, events[1:2])
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, 1, f.rows(t, "outbox"), "a batch of one event is a single-event row")
	none, err := f.store.WriteBatch(ctx, f.db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, none)
}

// A bad event fails the whole batch, naming the event and its field, and
// nothing is written.
func TestWriteBatchRejectsBadEvents(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	good := outbox.Event{Topic: "orders", Type: "order.placed", Payload: json.RawMessage(`{}`)}
	id := uuid.Must(uuid.NewV7())
	for _, tc := range []struct {
		name   string
		events []outbox.Event
		field  string
	}{
		{"no topic", []outbox.Event{good, {Type: "x", Payload: json.RawMessage(`{}`)}}, "Events[1].Topic"},
		{"bad payload", []outbox.Event{good, good, {Topic: "t", Type: "x", Payload: json.RawMessage(`{`)}}, "Events[2].Payload"},
		{"payload jsonb cannot hold", []outbox.Event{good, {Topic: "t", Type: "x", Payload: json.RawMessage(`{"a":"\u0000"}`)}}, "Events[1].Payload"},
		{"same id twice", []outbox.Event{{ID: id, Topic: "t", Type: "x", Payload: json.RawMessage(`{}`)}, good, {ID: id, Topic: "t", Type: "y", Payload: json.RawMessage(`{}`)}}, "Events[2].ID"},
		{"too many", make([]outbox.Event, outbox.MaxBatchEvents+1), "Events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := f.store.WriteBatch(t.Context(), f.db.Pool, tc.events)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent)
			var ve *llmqtype.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tc.field, ve.Field, "%v", err)
			require.Zero(t, f.rows(t, "outbox_batches"))
			require.Zero(t, f.rows(t, "outbox"))
		})
	}
}

// Single-event rows and batch rows written in turn, over few keys, with a
// third of first publications refused: every key's events reach the
// broker in write order, across both tables, whether relayed one claim at
// a time or overlapping (Drain). Refused events of batch rows are split
// out into single-event rows and retried from there, and so are the later
// events of their keys.
func TestBatchRowsKeepKeyOrderWithSingleEventRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		batch int
		relay func(*outbox.Relay, context.Context) (outbox.BatchResult, error)
	}{
		{"RelayOnce", 20, (*outbox.Relay).RelayOnce},
		{"Drain", 8, (*outbox.Relay).Drain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setupRelay(t)
			b := refusingFirstAttempts(5, 6)
			const keys = 6
			key := func(i int) string { return fmt.Sprintf("key-%d", i%keys) }
			written := 0
			for round := range 60 {
				n := 1
				if round%3 != 0 {
					n = 2 + round%17
				}
				if n == 1 {
					_, err := f.store.Write(t.Context(), f.db.Pool, orderEvents(written, 1, key)[0])
					require.NoError(t, err)
				} else {
					_, err := f.store.WriteBatch(t.Context(), f.db.Pool, orderEvents(written, n, key))
					require.NoError(t, err)
				}
				written += n
			}
			r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{
				BatchSize: tc.batch,
				Backoff:   llmqtype.BackoffPolicy{Base: 5 * time.Millisecond, Cap: 10 * time.Millisecond},
			})
			require.NoError(t, err)
			var total outbox.BatchResult
			require.Eventually(t, func() bool {
				res, err := tc.relay(r, t.Context())
				require.NoError(t, err)
				total.Claimed += res.Claimed
				total.Published += res.Published
				total.Failed += res.Failed
				total.Deferred += res.Deferred
				return f.unpublished(t) == 0
			}, 30*time.Second, time.Millisecond)

			got := drain(t, b, written)
			require.Len(t, got, written, "nothing published twice")
			requireKeyOrder(t, got)
			require.Equal(t, written, total.Published)
			require.Positive(t, total.Failed)
			require.Positive(t, total.Deferred, "later events of a refused key wait in single-event rows")
			var fromRows, split int
			require.NoError(t, f.db.Pool.QueryRow(t.Context(), fmt.Sprintf(
				"SELECT coalesce(sum(event_count - cardinality(split)), 0), coalesce(sum(cardinality(split)), 0) FROM %s.outbox_batches", f.db.Schema)).
				Scan(&fromRows, &split))
			require.Positive(t, fromRows, "events published from their batch rows")
			require.Positive(t, split)
			require.Equal(t, written, fromRows+f.rows(t, "outbox"), "each event published once: from its row or as a copy")
		})
	}
}

// A batch row a relay claimed and never settled (it died, or its
// publication hung past the claim) is not published again as a row: the
// next claim splits it whole into single-event rows, keeping each event's
// seq and id, which are then published one by one.
func TestABatchRowNeverSettledIsSplitWhole(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	recs, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 5, func(i int) string { return fmt.Sprint("key-", i%2) }))
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET claimed_by = 'dead', claimed_until = now() - interval '1 second', attempts = 1")
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 5, Deferred: 5}, res)
	require.Zero(t, b.Published("orders"))

	rows, err := f.db.Pool.Query(ctx, "SELECT event_id, seq, attempts, last_error FROM "+f.db.Schema+".outbox ORDER BY seq")
	require.NoError(t, err)
	type copied struct {
		ID        uuid.UUID
		Seq       int64
		Attempts  int
		LastError string
	}
	copies, err := pgx.CollectRows(rows, pgx.RowToStructByPos[copied])
	require.NoError(t, err)
	require.Len(t, copies, 5)
	for i, c := range copies {
		require.Equal(t, recs[i].ID, c.ID)
		require.Equal(t, recs[i].Seq, c.Seq)
		require.Equal(t, 1, c.Attempts)
		require.Contains(t, c.LastError, "never settled")
	}

	res, err = r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, res.Published)
	require.Zero(t, f.unpublished(t))
	var keyZero []string
	for _, m := range drain(t, b, 5) {
		if m.Key == "key-0" {
			keyZero = append(keyZero, m.ID)
		}
	}
	require.Equal(t, []string{recs[0].ID.String(), recs[2].ID.String(), recs[4].ID.String()}, keyZero, "in write order")
}

// The relay that takes the leader lease over releases the batch rows its
// dead predecessor claimed, as it does its single-event rows, and their
// events are published.
func TestTakeoverReleasesBatchRowClaims(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	_, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 4, func(i int) string { return fmt.Sprint("key-", i) }))
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET claimed_by = 'dead', claimed_until = now() + interval '1 hour', attempts = 1")
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_relay_lease SET holder = 'dead', lease_epoch = 1, lease_until = now() - interval '1 second'")
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	f.runRelay(t, b.Publisher(), outbox.RelayConfig{PollInterval: 10 * time.Millisecond})
	drain(t, b, 4)
	require.Eventually(t, func() bool { return f.unpublished(t) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// Published batch rows are pruned after Retention, counting their events;
// with DeletePublished they are deleted once published.
func TestBatchRowsArePrunedOrDeleted(t *testing.T) {
	t.Parallel()
	for _, deletePublished := range []bool{false, true} {
		t.Run(fmt.Sprintf("DeletePublished=%v", deletePublished), func(t *testing.T) {
			t.Parallel()
			f := setupRelay(t)
			ctx := t.Context()
			_, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 3, func(int) string { return "" }))
			require.NoError(t, err)
			b := memory.New(memory.Config{})
			r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{DeletePublished: deletePublished, Retention: time.Hour})
			require.NoError(t, err)
			res, err := r.Drain(ctx)
			require.NoError(t, err)
			require.Equal(t, 3, res.Published)
			if deletePublished {
				require.Zero(t, f.rows(t, "outbox_batches"))
				return
			}
			require.Equal(t, 1, f.rows(t, "outbox_batches"))
			pruner, err := outbox.NewPruner(f.db.Schema)
			require.NoError(t, err)
			n, err := pruner.CountPublished(ctx, f.db.Pool, time.Hour)
			require.NoError(t, err)
			require.Zero(t, n, "published just now")
			_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET published_at = now() - interval '2 hours'")
			require.NoError(t, err)
			n, err = pruner.CountPublished(ctx, f.db.Pool, time.Hour)
			require.NoError(t, err)
			require.Equal(t, int64(3), n)
			pruned, err := r.Prune(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(3), pruned)
			require.Zero(t, f.rows(t, "outbox_batches"))
		})
	}
}

// A verdict on a batch row another session holds does not wait for it and
// is not lost: it is recorded by the relay's next transaction once the row
// is free, and nothing is published twice.
func TestAVerdictOnAHeldBatchRowIsKept(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 3, func(i int) string { return fmt.Sprint("key-", i) }))
	require.NoError(t, err)
	b := memory.New(memory.Config{})
	locked := make(chan pgx.Tx, 1)
	pub := &lockingPublisher{Publisher: b.Publisher(), lock: func(string) {
		operator, err := f.db.Pool.Begin(context.Background())
		require.NoError(t, err)
		t.Cleanup(func() { _ = operator.Rollback(context.Background()) })
		_, err = operator.Exec(context.Background(), "SELECT FROM "+f.db.Schema+".outbox_batches FOR UPDATE")
		require.NoError(t, err)
		locked <- operator
	}}
	r, err := f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
	operator := <-locked
	require.Equal(t, 3, f.unpublished(t), "the verdict waits for the row")

	require.NoError(t, operator.Rollback(ctx))
	res, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Claimed)
	require.Zero(t, f.unpublished(t))
	require.Equal(t, 3, b.Published("orders"), "nothing was published twice")
}

// Batch rows are published in write order, never past one another: while
// another relay's claim holds the first, neither the batch rows after it
// nor the keyed single-event rows written after it are claimed; a keyless
// single-event row is.
func TestABatchRowInFlightHoldsWhatComesAfterIt(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	key := func(i int) string { return fmt.Sprint("key-", i%2) }
	first, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 2, key))
	require.NoError(t, err)
	_, err = f.store.WriteBatch(ctx, f.db.Pool, orderEvents(2, 2, key))
	require.NoError(t, err)
	_, err = f.store.Write(ctx, f.db.Pool, orderEvents(4, 1, key)[0])
	require.NoError(t, err)
	_, err = f.store.Write(ctx, f.db.Pool, orderEvents(5, 1, func(int) string { return "" })[0])
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET claimed_by = 'other', claimed_until = now() + interval '1 hour', attempts = 1 WHERE first_seq = $1", first[0].Seq)
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 1, Published: 1}, res, "only the keyless event")
	require.Equal(t, 5, f.unpublished(t))

	// Once the first row's claim runs out, it is split whole (claimed
	// before, never settled), and everything goes out in key order.
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET claimed_until = now() - interval '1 second' WHERE first_seq = $1", first[0].Seq)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := r.Drain(t.Context())
		require.NoError(t, err)
		return f.unpublished(t) == 0
	}, 10*time.Second, 10*time.Millisecond)
	requireKeyOrder(t, drain(t, b, 6))
}

// largestPublish records the largest Publish call it passed on.
type largestPublish struct {
	broker.Publisher
	mu      sync.Mutex
	largest int
}

func (p *largestPublish) Publish(ctx context.Context, msgs []broker.Message) error {
	p.mu.Lock()
	p.largest = max(p.largest, len(msgs))
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, msgs)
}

// A claim takes the first batch row whatever its size, and publishes it in
// parts of at most BatchSize messages.
func TestALargeBatchRowIsPublishedInParts(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	_, err := f.store.WriteBatch(t.Context(), f.db.Pool, orderEvents(0, 50, func(i int) string { return fmt.Sprint("key-", i) }))
	require.NoError(t, err)
	b := memory.New(memory.Config{})
	pub := &largestPublish{Publisher: b.Publisher()}
	r, err := f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{BatchSize: 20})
	require.NoError(t, err)
	res, err := r.RelayOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 50, res.Published, "one claim")
	require.Equal(t, 20, pub.largest)
	require.Zero(t, f.unpublished(t))
}

// A batch row another session holds locked is not claimed while it is
// held, and neither is any batch row after it; the relay does not wait
// for it beyond its lock timeout, and goes on with single-event rows.
func TestABatchRowHeldElsewhereHoldsTheRowsAfterIt(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	first, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 2, func(i int) string { return fmt.Sprint("key-", i) }))
	require.NoError(t, err)
	_, err = f.store.WriteBatch(ctx, f.db.Pool, orderEvents(2, 2, func(i int) string { return fmt.Sprint("key-", i) }))
	require.NoError(t, err)
	_, err = f.store.Write(ctx, f.db.Pool, orderEvents(4, 1, func(int) string { return "" })[0])
	require.NoError(t, err)
	operator, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = operator.Rollback(context.Background()) }()
	_, err = operator.Exec(ctx, "SELECT FROM "+f.db.Schema+".outbox_batches WHERE first_seq = $1 FOR UPDATE", first[0].Seq)
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	outbox.SetClaimLockTimeout(r, 20*time.Millisecond)
	for range 2 { // the lock-free claim that waits, then one skipping locked rows
		res, err := r.RelayOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, res.Failed)
	}
	require.Equal(t, 1, b.Published("orders"), "only the single-event row")
	require.Equal(t, 4, f.unpublished(t))

	require.NoError(t, operator.Rollback(ctx))
	res, err := r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, res.Published)
	requireKeyOrder(t, drain(t, b, 5))
}

// When a claim holds a batch row that is split whole (claimed before and
// never settled) after another row with events of the same keys, the
// earlier row's events are still published from it: only a key's events
// after a split one must wait.
func TestOnlyLaterEventsOfASplitKeyWait(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	key := func(i int) string { return fmt.Sprint("key-", i%2) }
	_, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 2, key))
	require.NoError(t, err)
	stuck, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(2, 2, key))
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET attempts = 1 WHERE first_seq = $1", stuck[0].Seq)
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.BatchResult{Claimed: 4, Published: 2, Deferred: 2}, res)
	res, err = r.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published)
	requireKeyOrder(t, drain(t, b, 4))
}

// A batch row the relay cannot read (written by hand with a header that is
// not a string) is logged and left waiting; the single-event rows claimed
// with it are published, not stranded.
func TestAnUnreadableBatchRowStrandsNothingElse(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	_, err := f.store.WriteBatch(ctx, f.db.Pool, orderEvents(0, 2, func(int) string { return "" }))
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+`.outbox_batches SET events = jsonb_set(events::jsonb, '{0,headers}', '{"h": 1}')`)
	require.NoError(t, err)
	_, err = f.store.Write(ctx, f.db.Pool, orderEvents(2, 1, func(int) string { return "" })[0])
	require.NoError(t, err)

	b := memory.New(memory.Config{})
	r, err := f.store.NewRelay(f.db.Pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published, "the single-event row")
	require.Equal(t, 2, f.unpublished(t), "the unreadable row waits")
	require.Equal(t, 1, b.Published("orders"))
}
