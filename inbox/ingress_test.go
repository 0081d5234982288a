package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/llmqtype"
)

// erpFixture is an ingress whose handler writes each message id to a
// table, in the inbox's transaction, as an ERP integration would.
type erpFixture struct {
	*fixture
	broker *memory.Broker
	calls  atomic.Int32
	fail   atomic.Int32 // fail this many calls with a transient error
}

func setupERP(t *testing.T) *erpFixture {
	t.Helper()
	f := &erpFixture{fixture: setup(t, 4), broker: memory.New(memory.Config{})}
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".erp_ops (message_id text PRIMARY KEY)")
	require.NoError(t, err)
	return f
}

func (f *erpFixture) handler(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
	f.calls.Add(1)
	if string(msg.Body) == "not json" {
		return inbox.Malformed(errors.New("body is not JSON"))
	}
	if f.fail.Add(-1) >= 0 {
		return errors.New("ERP briefly unavailable")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".erp_ops (message_id) VALUES ($1)", msg.ID)
	return err
}

func (f *erpFixture) ingress(t *testing.T, c broker.Consumer) *inbox.Ingress {
	t.Helper()
	in, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: f.handler})
	require.NoError(t, err)
	return in
}

func (f *erpFixture) publish(t *testing.T, msgs ...broker.Message) {
	t.Helper()
	require.NoError(t, f.broker.Publisher().Publish(t.Context(), msgs))
}

func (f *erpFixture) ops(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".erp_ops").Scan(&n))
	return n
}

func receive(t *testing.T, c broker.Consumer) broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	d, err := c.Receive(ctx)
	require.NoError(t, err)
	return d
}

// The consumer stops between the database commit and the ack: the broker
// redelivers, and the redelivery is a duplicate that changes nothing.
func TestIngressRedeliveryAfterCommitIsANoOp(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	f.publish(t, broker.Message{ID: "op-1", Topic: "erp", Body: []byte(`{"invoice":1}`)})

	first := f.broker.Consumer("erp")
	in := f.ingress(t, first)
	d := receive(t, first)
	// Commit happens inside Handle; stop the consumer before its ack lands
	// by handing Handle a delivery whose Ack never reaches the broker.
	require.NoError(t, in.Handle(t.Context(), lostAck{d}))
	require.NoError(t, first.Close()) // the process stopped: the delivery was never acked
	require.Equal(t, 1, f.ops(t))

	second := f.broker.Consumer("erp")
	redelivered := receive(t, second)
	require.Equal(t, "op-1", redelivered.Message().ID)
	require.NoError(t, f.ingress(t, second).Handle(t.Context(), redelivered))
	require.Equal(t, int32(1), f.calls.Load(), "the handler did not run again")
	require.Equal(t, 1, f.ops(t), "the ERP operation exists once")
}

// idStripper delivers the message with id "strip-me" without an id.
type idStripper struct{ broker.Consumer }

func (c idStripper) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err != nil || d.Message().ID != "strip-me" {
		return d, err
	}
	return noID{d}, nil
}

type noID struct{ broker.Delivery }

func (d noID) Message() broker.Message {
	m := d.Delivery.Message()
	m.ID = ""
	return m
}

// lostAck is a delivery whose acknowledgement is lost on the way.
type lostAck struct{ broker.Delivery }

func (lostAck) Ack(context.Context) error { return nil }

func TestIngressQuarantinesMalformedAndContinues(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	// The memory broker refuses messages without an id; other producers on
	// a real broker do not, so the consumer here blanks one on the way in.
	c := idStripper{f.broker.Consumer("erp")}
	in := f.ingress(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()

	f.publish(t,
		broker.Message{ID: "strip-me", Topic: "erp", Body: []byte(`{"no":"id"}`)},
		broker.Message{ID: "op-bad", Topic: "erp", Body: []byte("not json")},
		broker.Message{ID: "op-2", Topic: "erp", Body: []byte(`{"invoice":2}`)},
	)
	require.Eventually(t, func() bool { return f.ops(t) == 1 }, 5*time.Second, 10*time.Millisecond, "the good message after the bad ones is processed")
	cancel()
	require.NoError(t, <-done)

	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 2)
	require.Contains(t, q[0].Reason, "no id")
	require.Equal(t, "op-bad", q[1].MessageID)
	require.Contains(t, q[1].Reason, "body is not JSON")
}

// A transient failure rolls back and nacks; the redelivery is processed.
func TestIngressRetriesTransientFailures(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	f.fail.Store(2)
	c := f.broker.Consumer("erp")
	in := f.ingress(t, c)
	f.publish(t, broker.Message{ID: "op-3", Topic: "erp", Body: []byte(`{"invoice":3}`)})

	for range 2 {
		err := in.Handle(t.Context(), receive(t, c))
		require.ErrorContains(t, err, "briefly unavailable")
		require.Zero(t, f.ops(t))
		require.Zero(t, f.accepted(t), "the inbox row rolled back with the work")
	}
	d := receive(t, c)
	md, ok := d.(*memory.Delivery)
	require.True(t, ok)
	require.Equal(t, 3, md.Attempt(), "delivered a third time")
	require.NoError(t, in.Handle(t.Context(), d))
	require.Equal(t, 1, f.ops(t))
}

// Deliveries available together are handled in one transaction, each in
// its own savepoint: a transient failure and a malformed message in the
// middle of a batch leave the others committed.
func TestIngressBatchesAndIsolatesFailures(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".batch_ops (message_id text PRIMARY KEY, txid bigint NOT NULL)")
	require.NoError(t, err)
	var op5Failures atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".batch_ops VALUES ($1, txid_current())", msg.ID); err != nil {
			return err
		}
		switch {
		case msg.ID == "op-7":
			return inbox.Malformed(errors.New("unusable"))
		case msg.ID == "op-5" && op5Failures.Add(1) <= 2:
			// Twice: in the whole batch, then in its savepoint, which must
			// undo its insert alone.
			return errors.New("ERP briefly unavailable")
		}
		return nil
	}
	// Accepted before: one redelivered as it was, one reused with another
	// payload.
	for _, id := range []string{"seen-same", "seen-other"} {
		_, err := f.store.Accept(t.Context(), f.pool, "erp", broker.Message{ID: id, Body: []byte(`{}`)}, broker.Source{})
		require.NoError(t, err)
	}
	msgs := make([]broker.Message, 20)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("op-%d", i), Topic: "erp", Body: []byte(`{}`)}
	}
	msgs = append(msgs,
		broker.Message{ID: "seen-same", Topic: "erp", Body: []byte(`{}`)},
		broker.Message{ID: "seen-other", Topic: "erp", Body: []byte(`{"other":1}`)})
	f.publish(t, msgs...)
	in, err := f.store.NewIngress(f.pool, f.broker.Consumer("erp"), inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxBatch: 11, Linger: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()

	count := func(q string) int {
		var n int
		require.NoError(t, f.pool.QueryRow(t.Context(), q).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool {
		return count("SELECT count(*) FROM "+f.schema+".batch_ops") == 19 && len(f.broker.DeadLetters("erp")) == 2
	}, 10*time.Second, 10*time.Millisecond, "all but the malformed message committed, the transient one after its retry; two rejected")
	cancel()
	require.NoError(t, <-done)
	require.Less(t, count("SELECT count(DISTINCT txid) FROM "+f.schema+".batch_ops"), 10, "messages shared transactions")
	require.Equal(t, 1, count("SELECT count(*) FROM "+f.schema+".batch_ops WHERE message_id = 'op-5'"))
	require.Equal(t, int32(3), op5Failures.Load(), "op-5 was nacked once and then committed")
	require.Equal(t, 19+2, f.accepted(t))
	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 2)
	require.ElementsMatch(t, []string{"op-7", "seen-other"}, []string{q[0].MessageID, q[1].MessageID})
	require.Zero(t, count("SELECT count(*) FROM "+f.schema+".batch_ops WHERE message_id LIKE 'seen-%'"), "the handler never saw the duplicates")
}

// Concurrent batches accept each message exactly once.
func TestIngressConcurrentBatches(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	msgs := make([]broker.Message, 300)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("op-%d", i), Topic: "erp", Body: []byte(`{}`)}
	}
	f.publish(t, msgs...)
	in, err := f.store.NewIngress(f.pool, f.broker.Consumer("erp"), inbox.IngressConfig{Consumer: "erp", Handler: f.handler, MaxBatch: 20, Concurrency: 3})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool { return f.ops(t) == len(msgs) }, 20*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, int32(len(msgs)), f.calls.Load())
}

func TestIngressConfigValidation(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	c := f.broker.Consumer("erp")
	_, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: f.handler, MaxBatch: inbox.MaxIngressBatch + 1})
	require.ErrorContains(t, err, "MaxBatch")
	_, err = f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: f.handler, Linger: -time.Second})
	require.ErrorContains(t, err, "Linger")
	for field, cfg := range map[string]inbox.IngressConfig{
		"IngressConfig.Handler":     {Consumer: "erp"},
		"IngressConfig.Consumer":    {Handler: f.handler},
		"IngressConfig.MaxAttempts": {Consumer: "erp", Handler: f.handler, MaxAttempts: -1},
		"IngressConfig.Concurrency": {Consumer: "erp", Handler: f.handler, Concurrency: -1},
		"IngressConfig.Tombstones":  {Consumer: "erp", Handler: f.handler, Tombstones: inbox.HandleTombstones + 1},
	} {
		_, err := f.store.NewIngress(f.pool, c, cfg)
		require.ErrorIs(t, err, inbox.ErrInvalidConfig, field)
		var invalid *llmqtype.ValidationError
		require.ErrorAs(t, err, &invalid, field)
		require.Equal(t, field, invalid.Field)
	}
}

// A batch whose commit fails is nacked whole, quarantined messages
// included, and processed again from scratch.
func TestIngressFailedCommitNacksTheBatch(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	// A deferred constraint fails at COMMIT, after every handler succeeded.
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".parent (id int PRIMARY KEY); "+
		"CREATE TABLE "+f.schema+".child (parent int REFERENCES "+f.schema+".parent DEFERRABLE INITIALLY DEFERRED)")
	require.NoError(t, err)
	var broken atomic.Bool
	broken.Store(true)
	handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		if msg.ID == "op-0" && broken.CompareAndSwap(true, false) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".child VALUES (1)"); err != nil {
				return err
			}
		}
		return f.handler(ctx, tx, msg)
	}
	_, err = f.store.Accept(t.Context(), f.pool, "erp", broker.Message{ID: "reused", Body: []byte(`{}`)}, broker.Source{})
	require.NoError(t, err)
	f.publish(t,
		broker.Message{ID: "op-0", Topic: "erp", Body: []byte(`{}`)},
		broker.Message{ID: "op-1", Topic: "erp", Body: []byte(`{}`)},
		broker.Message{ID: "reused", Topic: "erp", Body: []byte(`{"other":1}`)},
	)
	c := f.broker.Consumer("erp")
	in, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxBatch: 3, Linger: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool {
		return f.ops(t) == 2 && len(f.broker.DeadLetters("erp")) == 1
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, int32(4), f.calls.Load(), "op-0 and op-1 were handled twice: the first commit failed")
	require.Equal(t, 3, f.accepted(t))
	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 1, "the quarantine row of the failed commit rolled back; the retry wrote one")
	require.Equal(t, "reused", q[0].MessageID)
}
