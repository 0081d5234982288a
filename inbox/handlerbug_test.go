package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
)

// A handler that ignores the error of one of its own statements, which
// aborted the transaction, and returns nil leaves its savepoint unusable.
// That is the handler's failure: counted toward MaxAttempts, and the
// message quarantined and rejected at the MaxAttempts-th, while the other
// messages of its batches are handled and committed once each. Before, it
// nacked the whole batch uncounted, and the message came back forever.
func TestIngressHandlerIgnoringAFailedStatementIsItsFailure(t *testing.T) {
	t.Parallel()
	for _, maxBatch := range []int{1, 10} {
		t.Run(fmt.Sprintf("MaxBatch %d", maxBatch), func(t *testing.T) {
			t.Parallel()
			f := setupERP(t)
			b := memory.New(memory.Config{RedeliveryDelay: 5 * time.Millisecond})
			var ignored atomic.Int32
			handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
				if msg.ID == "ignores-its-error" {
					ignored.Add(1)
					_, _ = tx.Exec(ctx, "SELECT 1/0") // the bug: the error is dropped
					return nil
				}
				return f.handler(ctx, tx, msg)
			}
			require.NoError(t, b.Publisher().Publish(t.Context(), opsWith(20, 4, "ignores-its-error")))
			var logs telemetrytest.LogBuffer
			in, err := f.store.NewIngress(f.pool, b.Consumer("erp"), inbox.IngressConfig{
				Consumer: "erp", Handler: handler, MaxAttempts: 2, MaxBatch: maxBatch, Linger: 50 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- in.Run(ctx) }()
			require.Eventually(t, func() bool {
				return f.ops(t) == 20 && len(b.DeadLetters("erp")) == 1
			}, 20*time.Second, 10*time.Millisecond, "the good messages committed and the bad one rejected")
			cancel()
			require.NoError(t, <-done)

			require.Equal(t, "ignores-its-error", b.DeadLetters("erp")[0].ID)
			require.Equal(t, 20, f.accepted(t), "each good message accepted once, the bad one never")
			if maxBatch == 1 {
				require.Equal(t, int32(2), ignored.Load(), "quarantined at the second failure")
			}
			q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
			require.NoError(t, err)
			require.Len(t, q, 1)
			require.Equal(t, "ignores-its-error", q[0].MessageID)
			require.Contains(t, q[0].Reason, inbox.ErrTooManyAttempts.Error())
			require.Contains(t, q[0].Reason, "2 failures")
			require.Contains(t, q[0].Reason, "savepoint unusable")
			require.Contains(t, q[0].Reason, "25P02")
			require.Contains(t, logs.String(), "inbox handler bug")
		})
	}
}

// slowReject is a consumer whose deliveries' first Reject blocks until its
// context ends and then fails, handing the message back, as a Kafka
// dead-letter produce that never completes does; every Ack records
// whether its context was still live.
type slowReject struct {
	broker.Consumer
	rejects  *atomic.Int32
	deadAcks *atomic.Int32 // Acks given an ended context
	liveAcks *atomic.Int32
}

func (c slowReject) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err != nil {
		return d, err
	}
	return slowRejectDelivery{d, c}, nil
}

type slowRejectDelivery struct {
	broker.Delivery
	c slowReject
}

func (d slowRejectDelivery) Reject(ctx context.Context, reason error) error {
	if d.c.rejects.Add(1) == 1 {
		<-ctx.Done()
		if err := d.Nack(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		return fmt.Errorf("dead-lettering: %w", ctx.Err())
	}
	return d.Delivery.Reject(ctx, reason)
}

func (d slowRejectDelivery) Ack(ctx context.Context) error {
	if ctx.Err() != nil {
		d.c.deadAcks.Add(1)
	} else {
		d.c.liveAcks.Add(1)
	}
	return d.Delivery.Ack(ctx)
}

// A Reject that uses up its whole settle deadline does not leave the next
// delivery of its batch to be settled with an ended context: each settle
// has its own deadline, and the next message of that delivery's key is
// still processed.
func TestIngressSlowRejectDoesNotStarveTheNextSettle(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	b := memory.New(memory.Config{RedeliveryDelay: 5 * time.Millisecond})
	require.NoError(t, b.Publisher().Publish(t.Context(), []broker.Message{
		{ID: "poison", Topic: "erp", Key: "p", Body: []byte("not json")},
		{ID: "op-1", Topic: "erp", Key: "k", Body: []byte(`{}`)},
		{ID: "op-2", Topic: "erp", Key: "k", Body: []byte(`{}`)}, // delivered once op-1 is settled
	}))
	var rejects, deadAcks, liveAcks atomic.Int32
	c := slowReject{Consumer: b.Consumer("erp"), rejects: &rejects, deadAcks: &deadAcks, liveAcks: &liveAcks}
	in, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: f.handler, MaxBatch: 2, Linger: time.Second})
	require.NoError(t, err)
	inbox.SetSettleTimeout(in, 300*time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool {
		return f.ops(t) == 2 && len(b.DeadLetters("erp")) == 1
	}, 20*time.Second, 10*time.Millisecond, "op-2 processed after op-1, the poison rejected")
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, int32(2), rejects.Load(), "rejected twice: the first ran out of time")
	require.Zero(t, deadAcks.Load(), "an Ack was given an ended context")
	require.Equal(t, int32(2), liveAcks.Load())
}
