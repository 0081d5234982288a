package rabbitmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
)

// Each delivery reports its attempt, counted by the quorum queue's
// x-delivery-count, against the queue's limit taken from the topology: a
// limit of 2 allows 3 deliveries, and the broker dead-letters the message
// when the third is nacked.
func TestDeliveryAttemptCountsAgainstTheLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Queue{Bindings: []string{"orders.#"}, DeliveryLimit: 2})
	require.NoError(t, f.publisher(t, false).Publish(t.Context(), []broker.Message{msg(1)}))
	conn := f.conn(t, false)
	conn.Topology = &f.topo
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: conn, Queue: f.queue.Name, RequeueDelay: 10 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	for want := 1; want <= 3; want++ {
		d, ok := receive(t, c).(broker.LimitedDelivery)
		require.True(t, ok, "a RabbitMQ delivery reports its attempts")
		attempt, limit := d.DeliveryAttempt()
		require.Equal(t, [2]int{want, 3}, [2]int{attempt, limit})
		require.NoError(t, d.Nack(t.Context()))
	}
	// The dead letter, read by a consumer of the dead-letter queue, carries
	// the broker's x-death header as JSON.
	_, dlq := f.queue.DeadLetterNames()
	dc, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: f.conn(t, false), Queue: dlq})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dc.Close() })
	dead := receive(t, dc).Message()
	require.Equal(t, "ev-1", dead.ID)
	var deaths []map[string]any
	require.NoError(t, json.Unmarshal([]byte(dead.Headers["x-death"]), &deaths), dead.Headers["x-death"])
	require.Len(t, deaths, 1)
	require.Equal(t, "delivery_limit", deaths[0]["reason"], "the third nack was the last")
	require.Equal(t, f.queue.Name, deaths[0]["queue"])
	require.Equal(t, []any{"orders.created"}, deaths[0]["routing-keys"])
	require.InDelta(t, 1, deaths[0]["count"], 0)
	at, ok := deaths[0]["time"].(string)
	require.True(t, ok)
	_, err = time.Parse(time.RFC3339, at)
	require.NoError(t, err)
}

func xDeathReason(t *testing.T, d amqp.Delivery) any {
	t.Helper()
	deaths, ok := d.Headers["x-death"].([]any)
	require.True(t, ok, "x-death header: %v", d.Headers)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok)
	return death["reason"]
}

// A message whose handling fails on every delivery, transiently or not,
// through a queue with a delivery limit is never dead-lettered by the
// broker unrecorded: the ingress quarantines it on its last delivery with
// ErrDeliveryLimit, logs an error, and rejects it itself (x-death
// "rejected", not "delivery_limit"). The message after it is handled.
func TestIngressQuarantinesOnTheLastDelivery(t *testing.T) {
	t.Parallel()
	for name, failure := range map[string]error{
		"transient": inbox.Transient(errors.New("the ERP is down")),
		"counted":   errors.New("the ERP refuses it"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := dbtest.Setup(t, dbtest.Options{MaxConns: 4})
			store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
			require.NoError(t, err)
			f := setup(t, rabbitmq.Queue{Bindings: []string{"orders.#"}, DeliveryLimit: 2})
			require.NoError(t, f.publisher(t, false).Publish(t.Context(), []broker.Message{msg(1), msg(2)}))

			var failed, handled atomic.Int32
			handler := func(_ context.Context, _ pgx.Tx, m broker.Message) error {
				if m.ID == "ev-1" {
					failed.Add(1)
					return failure
				}
				handled.Add(1)
				return nil
			}
			var logs telemetrytest.LogBuffer
			c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: f.conn(t, false), Queue: f.queue.Name,
				RequeueDelay: 10 * time.Millisecond, DeliveryLimit: 2})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			deliveries := &deliveriesOf{Consumer: c, id: "ev-1"}
			in, err := store.NewIngress(db.Pool, deliveries, inbox.IngressConfig{Consumer: "orders", Handler: handler,
				MaxAttempts: 100, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- in.Run(ctx) }()
			_, dlq := f.queue.DeadLetterNames()
			require.Eventually(t, func() bool {
				return queueDepth(t, dlq) == 1 && handled.Load() == 1
			}, 30*time.Second, 20*time.Millisecond)
			cancel()
			require.NoError(t, <-done)

			require.Equal(t, int64(3), deliveries.n.Load(), "delivered 3 times")
			require.GreaterOrEqual(t, failed.Load(), int32(3), "failing on each delivery (twice in a batch redone in savepoints)")
			q, err := store.ListQuarantined(t.Context(), db.Pool, "orders", 10)
			require.NoError(t, err)
			require.Len(t, q, 1, "quarantined, not dropped unrecorded")
			require.Equal(t, "ev-1", q[0].MessageID)
			require.Contains(t, q[0].Reason, inbox.ErrDeliveryLimit.Error())
			require.Contains(t, q[0].Reason, "delivery 3 of at most 3 failed: "+failure.Error())
			require.Contains(t, logs.String(), "level=ERROR msg=\"llmq: message quarantined and rejected\"")
			require.Contains(t, logs.String(), "message=ev-1")
			dead, ok := f.getDeadLetter(t)
			require.True(t, ok)
			require.Equal(t, "ev-1", dead.MessageId)
			require.Equal(t, "rejected", xDeathReason(t, dead), "rejected by the ingress, not dropped by the broker")
		})
	}
}

// If the quarantine row cannot be written on the last delivery (here its
// table is gone; in production, the database is down), the message is
// nacked, the broker dead-letters it for its delivery limit, and the
// ingress logs an error naming it, the one record left.
func TestIngressLogsALastDeliveryItCouldNotQuarantine(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 4})
	store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = db.Pool.Exec(t.Context(), "ALTER TABLE "+db.Schema+".inbox_quarantine RENAME TO gone")
	require.NoError(t, err)
	f := setup(t, rabbitmq.Queue{Bindings: []string{"orders.#"}, DeliveryLimit: 1})
	require.NoError(t, f.publisher(t, false).Publish(t.Context(), []broker.Message{msg(1)}))
	handler := func(context.Context, pgx.Tx, broker.Message) error {
		return inbox.Transient(errors.New("the ERP is down"))
	}
	var logs telemetrytest.LogBuffer
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: f.conn(t, false), Queue: f.queue.Name,
		RequeueDelay: 10 * time.Millisecond, DeliveryLimit: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	in, err := store.NewIngress(db.Pool, c, inbox.IngressConfig{Consumer: "orders", Handler: handler,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	_, dlq := f.queue.DeadLetterNames()
	require.Eventually(t, func() bool { return queueDepth(t, dlq) == 1 }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	dead, ok := f.getDeadLetter(t)
	require.True(t, ok)
	require.Equal(t, "delivery_limit", xDeathReason(t, dead))
	require.Contains(t, logs.String(), "level=ERROR msg=\"llmq: message dead-lettered by the broker without a quarantine row\"")
	require.Contains(t, logs.String(), "message=ev-1")
	require.Contains(t, logs.String(), "delivery 2 of at most 2 failed")
}

// deliveriesOf counts the deliveries of one message id. It hands on the
// consumer's own deliveries, so they keep reporting their attempts.
type deliveriesOf struct {
	broker.Consumer
	id string
	n  atomic.Int64
}

func (c *deliveriesOf) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err == nil && d.Message().ID == c.id {
		c.n.Add(1)
	}
	return d, err
}

// Without a limit configured or declared, a consumer takes the broker's
// default: none on RabbitMQ 3, 20 from RabbitMQ 4 on. NoDeliveryLimit
// says there is none on any broker.
func TestDeliveryLimitDefaults(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(amqpURL())
	require.NoError(t, err)
	version, _ := conn.Properties["version"].(string)
	require.NoError(t, conn.Close())
	brokerDefault := 0
	if version >= "4." {
		brokerDefault = 20 + 1
	}
	f := setup(t)
	require.NoError(t, f.publisher(t, false).Publish(t.Context(), []broker.Message{msg(1)}))
	for i, limit := range []int{0, rabbitmq.NoDeliveryLimit} {
		c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: f.conn(t, false), Queue: f.queue.Name, DeliveryLimit: limit})
		require.NoError(t, err)
		d, ok := receive(t, c).(broker.LimitedDelivery)
		require.True(t, ok)
		attempt, most := d.DeliveryAttempt()
		require.Equal(t, i+1, attempt, "the first consumer's closing handed it back")
		if limit == 0 {
			require.Equal(t, brokerDefault, most, "RabbitMQ %s", version)
		} else {
			require.Zero(t, most)
		}
		require.NoError(t, c.Close()) // hands the message back for the next consumer
	}
}

// The consumer refuses a negative delivery limit and one that contradicts
// the topology it declares, naming the field.
func TestConsumerDeliveryLimitValidation(t *testing.T) {
	t.Parallel()
	_, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Queue: "q", DeliveryLimit: -2})
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	require.ErrorContains(t, err, "DeliveryLimit")
	topo := rabbitmq.Topology{Queues: []rabbitmq.Queue{{Name: "q", DeliveryLimit: 5}}}
	_, err = rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: rabbitmq.ConnConfig{Topology: &topo}, Queue: "q", DeliveryLimit: 20})
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	require.ErrorContains(t, err, "DeliveryLimit: is 20, but Topology declares queue q with DeliveryLimit 5")
}
