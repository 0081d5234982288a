package rabbitmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// pipeline is a database with an outbox, an inbox and a table the inbox
// handler writes each new message to.
type pipeline struct {
	*fixture
	pool   *pgxpool.Pool
	schema string
	outbox *outbox.Store
	inbox  *inbox.Store
	calls  atomic.Int64 // handler calls
}

func setupPipeline(t *testing.T) *pipeline {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 12})
	p := &pipeline{fixture: setup(t), pool: db.Pool, schema: db.Schema}
	var err error
	p.outbox, err = outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	p.inbox, err = inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = db.Pool.Exec(t.Context(), "CREATE TABLE "+db.Schema+".received (message_id text PRIMARY KEY)")
	require.NoError(t, err)
	return p
}

// handler inserts the message id (a second insert of one id would fail:
// the inbox must never hand it over twice) and refuses non-JSON bodies.
func (p *pipeline) handler(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
	p.calls.Add(1)
	if !json.Valid(msg.Body) {
		return inbox.Malformed(errors.New("the body is not JSON"))
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+p.schema+".received (message_id) VALUES ($1)", msg.ID)
	return err
}

func (p *pipeline) ingress(t *testing.T, c broker.Consumer) *inbox.Ingress {
	t.Helper()
	in, err := p.inbox.NewIngress(p.pool, c, inbox.IngressConfig{Consumer: "orders", Handler: p.handler, MaxBatch: 100})
	require.NoError(t, err)
	return in
}

func (p *pipeline) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	require.NoError(t, p.pool.QueryRow(t.Context(), query).Scan(&n))
	return n
}

// countingConsumer counts deliveries, duplicates included.
type countingConsumer struct {
	broker.Consumer
	n atomic.Int64
}

func (c *countingConsumer) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err == nil {
		c.n.Add(1)
	}
	return d, err
}

// The relay publishes 5,000 outbox events while the test severs the
// publisher's and the consumer's connections five times: every event
// arrives, every event is marked published (and only after its confirm:
// none marked is missing), and the inbox hands each to the handler once
// however often it is delivered.
func TestRelayAndIngressSurviveSeveredConnections(t *testing.T) {
	t.Parallel()
	const events = 5000
	p := setupPipeline(t)
	for start := 0; start < events; start += 500 {
		err := pgx.BeginFunc(t.Context(), p.pool, func(tx pgx.Tx) error {
			for i := start; i < start+500; i++ {
				_, err := p.outbox.Write(t.Context(), tx, outbox.Event{
					Topic: "orders.created", Key: "order-" + strconv.Itoa(i%50), Type: "order.created",
					Payload: json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`),
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
	}

	pub := &severingPublisher{Publisher: p.publisher(t, true), proxy: p.proxy}
	relay, err := p.outbox.NewRelay(p.pool, pub, outbox.RelayConfig{
		BatchSize: 200, PollInterval: 20 * time.Millisecond,
		Backoff: llmqtype.BackoffPolicy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond},
	})
	require.NoError(t, err)
	consumer := &countingConsumer{Consumer: p.consumer(t, true)}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	relayDone, ingressDone := make(chan error, 1), make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	in := p.ingress(t, consumer)
	go func() { ingressDone <- in.Run(ctx) }()

	for i := 1; i <= 5; i++ {
		require.Eventually(t, func() bool {
			st, err := relay.Stats(t.Context())
			return err == nil && st.Published >= int64(i*events/7)
		}, 60*time.Second, 5*time.Millisecond)
		pub.severs.Add(1) // the next Publish severs the connections while it runs
	}
	require.Eventually(t, func() bool {
		return p.count(t, "SELECT count(*) FROM "+p.schema+".received") == events
	}, 120*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		return p.count(t, "SELECT count(*) FROM "+p.schema+".outbox WHERE published_at IS NULL") == 0
	}, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-relayDone)
	require.NoError(t, <-ingressDone)

	require.Zero(t, p.count(t, "SELECT count(*) FROM "+p.schema+".outbox o WHERE published_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "+p.schema+".received r WHERE r.message_id = o.event_id::text)"),
		"every event marked published arrived")
	require.Equal(t, events, p.count(t, "SELECT count(*) FROM "+p.schema+".inbox"))
	require.Equal(t, int64(events), p.calls.Load(), "each event handled once")
	st, err := relay.Stats(t.Context())
	require.NoError(t, err)
	require.Positive(t, st.Failed, "the severed connections failed some publications, which the relay retried")
	t.Logf("deliveries %d for %d events; relay publications failed and retried: %d", consumer.n.Load(), events, st.Failed)
}

// severingPublisher cuts the test's connections (the publisher's and the
// consumer's) while a Publish is under way, once per requested sever.
type severingPublisher struct {
	*rabbitmq.Publisher
	proxy  *proxy
	severs atomic.Int32
}

func (p *severingPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if p.severs.Add(-1) >= 0 {
		go p.proxy.Sever()
	} else {
		p.severs.Add(1)
	}
	return p.Publisher.Publish(ctx, msgs)
}

// lostAck is a delivery whose acknowledgement never reaches the broker, as
// when the consumer stops between the commit and the ack.
type lostAck struct{ broker.Delivery }

func (lostAck) Ack(context.Context) error { return nil }

// The consumer stops after the inbox commit and before the ack: the broker
// redelivers, and the redelivery is a duplicate that does nothing. A poison
// message is quarantined with its reason and ends in the dead-letter queue.
func TestRedeliveryAfterCommitIsANoOpAndPoisonIsDeadLettered(t *testing.T) {
	t.Parallel()
	p := setupPipeline(t)
	pub := p.publisher(t, false)
	poison := broker.Message{ID: "poison", Topic: "orders.created", Body: []byte("not json")}
	require.NoError(t, pub.Publish(t.Context(), []broker.Message{msg(1), poison}))

	first := p.consumer(t, false)
	d := receive(t, first)
	require.Equal(t, "ev-1", d.Message().ID)
	require.NoError(t, p.ingress(t, first).Handle(t.Context(), lostAck{d}))
	require.NoError(t, first.Close()) // stopped before the ack
	require.Equal(t, 1, p.count(t, "SELECT count(*) FROM "+p.schema+".received"))

	second := p.consumer(t, false)
	in := p.ingress(t, second)
	for range 2 {
		d := receive(t, second)
		err := in.Handle(t.Context(), d)
		switch d.Message().ID {
		case "ev-1":
			require.NoError(t, err)
			rd, ok := d.(*rabbitmq.Delivery)
			require.True(t, ok)
			require.True(t, rd.Redelivered())
		case "poison":
			require.ErrorIs(t, err, inbox.ErrMalformed)
		default:
			t.Fatalf("unexpected message %s", d.Message().ID)
		}
	}
	require.Equal(t, int64(2), p.calls.Load(), "ev-1's handler ran once; the poison's once")
	require.Equal(t, 1, p.count(t, "SELECT count(*) FROM "+p.schema+".received"))

	var dead amqp.Delivery
	require.Eventually(t, func() bool {
		var ok bool
		dead, ok = p.getDeadLetter(t)
		return ok
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "poison", dead.MessageId)
	deaths, ok := dead.Headers["x-death"].([]any)
	require.True(t, ok, "x-death header: %v", dead.Headers)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok)
	require.Equal(t, "rejected", death["reason"])
	require.Equal(t, p.queue.Name, death["queue"])

	q, err := p.inbox.ListQuarantined(t.Context(), p.pool, "orders", 10)
	require.NoError(t, err)
	require.Len(t, q, 1)
	require.Equal(t, "poison", q[0].MessageID)
	require.Equal(t, broker.Source{Queue: p.queue.Name}, q[0].Source)
	require.Contains(t, q[0].Reason, "the body is not JSON")

	require.NoError(t, second.Close())
	withChannel(t, func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclarePassive(p.queue.Name, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
		if err == nil && st.Messages != 0 {
			err = fmt.Errorf("%d messages left in %s", st.Messages, p.queue.Name)
		}
		return err
	})
}

// queueDepth returns how many messages queue holds.
func queueDepth(t *testing.T, queue string) int {
	t.Helper()
	var n int
	withChannel(t, func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
		n = st.Messages
		return err
	})
	return n
}

// Messages a plain AMQP client publishes, without llmq's publisher: those
// the inbox can never accept (no message-id, an id with a control
// character or invalid UTF-8, a header value that is not valid UTF-8 or
// holds NUL, a body the handler refuses) are quarantined and dead-lettered
// once each, never requeued in a loop; the good ones are received once;
// the queue drains.
func TestPlainAMQPPoisonIsDeadLettered(t *testing.T) {
	t.Parallel()
	p := setupPipeline(t)
	poisons := []amqp.Publishing{
		{Body: []byte(`{"no":"id"}`)},
		{MessageId: "ev-\x07", Body: []byte(`{}`)},
		{MessageId: "ev-\xff", Body: []byte(`{}`)},
		{MessageId: "hdr-1", Headers: amqp.Table{"traceparent": []byte{0xc3, 0x28}}, Body: []byte(`{}`)},
		{MessageId: "hdr-2", Headers: amqp.Table{"tenant": "a\x00b"}, Body: []byte(`{}`)},
		{MessageId: "not-json", Body: []byte("not json")},
	}
	const good = 200
	withChannel(t, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(poisons)+good))
		publish := func(pub amqp.Publishing) error {
			pub.DeliveryMode = amqp.Persistent
			return ch.PublishWithContext(t.Context(), p.topo.Exchange, "orders.created", false, false, pub)
		}
		for i := range good {
			if i%30 == 0 && i/30 < len(poisons) {
				if err := publish(poisons[i/30]); err != nil {
					return err
				}
			}
			if err := publish(amqp.Publishing{MessageId: fmt.Sprintf("good-%d", i), Body: []byte(`{}`)}); err != nil {
				return err
			}
		}
		for range len(poisons) + good {
			if c := <-confirms; !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
		}
		return nil
	})

	c := p.consumer(t, false)
	in := p.ingress(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	_, dlq := p.queue.DeadLetterNames()
	require.Eventually(t, func() bool {
		return p.count(t, "SELECT count(*) FROM "+p.schema+".received") == good && queueDepth(t, dlq) == len(poisons)
	}, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, c.Close())
	// The queue's count follows the last acknowledgements a moment later.
	require.Eventually(t, func() bool { return queueDepth(t, p.queue.Name) == 0 }, 10*time.Second, 20*time.Millisecond, "the queue drained")
	require.Equal(t, len(poisons), queueDepth(t, dlq), "each poison dead-lettered once")

	q, err := p.inbox.ListQuarantined(t.Context(), p.pool, "orders", 100)
	require.NoError(t, err)
	require.Len(t, q, len(poisons), "each poison quarantined once")
	for i, pub := range poisons {
		require.Equal(t, pub.MessageId, q[i].MessageID, "in publish order, the id's bytes kept")
		require.Equal(t, string(pub.Body), string(q[i].Payload))
		for k, v := range pub.Headers {
			want, ok := v.(string)
			if b, isBytes := v.([]byte); isBytes {
				want, ok = string(b), true
			}
			require.True(t, ok)
			require.Equal(t, want, q[i].Headers[k], "header bytes kept")
		}
	}
	require.Equal(t, good, p.count(t, "SELECT count(*) FROM "+p.schema+".received WHERE message_id LIKE 'good-%'"), "every good message received once")
}
