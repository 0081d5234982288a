package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/outbox"
)

// rabbitBench is one bench run's own exchange and quorum queue (bound to
// the "bench" routing key), deleted at the end.
type rabbitBench struct {
	url  string
	topo rabbitmq.Topology
	conn *amqp.Connection
}

func (b *bench) newRabbitBench() (*rabbitBench, error) {
	url := cmp.Or(b.o.amqpURL, rabbitmq.DefaultURL)
	name := "llmq.bench." + randomSuffix()
	r := &rabbitBench{url: url, topo: rabbitmq.Topology{Exchange: name, Queues: []rabbitmq.Queue{{Name: name, Bindings: []string{"bench"}}}}}
	var err error
	if r.conn, err = amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}); err != nil {
		return nil, fmt.Errorf("connecting to rabbitmq: %w", err)
	}
	if err := r.withChannel(r.topo.Declare); err != nil {
		_ = r.conn.Close()
		return nil, err
	}
	return r, nil
}

func (r *rabbitBench) withChannel(fn func(*amqp.Channel) error) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	return fn(ch)
}

func (r *rabbitBench) close(keep bool) error {
	defer func() { _ = r.conn.Close() }()
	if keep {
		return nil
	}
	return r.withChannel(r.topo.Delete)
}

func (r *rabbitBench) queue() string { return r.topo.Queues[0].Name }

// depth is the number of ready messages in the queue.
func (r *rabbitBench) depth() (int, error) {
	var n int
	err := r.withChannel(func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(r.queue(), true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
		n = q.Messages
		return err
	})
	return n, err
}

func (r *rabbitBench) purge() error {
	return r.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueuePurge(r.queue(), false)
		return err
	})
}

func (r *rabbitBench) publisher(ctx context.Context, window int) (*rabbitmq.Publisher, error) {
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: rabbitmq.ConnConfig{URL: r.url, Name: "llmq-bench"}, Exchange: r.topo.Exchange, Window: window})
	if err != nil {
		return nil, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.WaitConnected(waitCtx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// benchMessages are n messages shaped as the relay sends the bench's
// outbox events: the same body, key and headers.
func (b *bench) benchMessages(n int) []broker.Message {
	msgs := make([]broker.Message, n)
	for i := range msgs {
		id := uuid.NewString()
		msgs[i] = broker.Message{
			ID: id, Topic: "bench", Key: strconv.Itoa(i % 1000),
			Headers: map[string]string{outbox.HeaderEventID: id, outbox.HeaderEventType: "bench.event"},
			Body:    []byte(`{"n":` + strconv.Itoa(i) + `}`),
		}
	}
	return msgs
}

// rawPublish times the broker's confirmed-publish rate without llmq: one
// channel in confirm mode, window publishes in flight, mandatory and
// persistent, as the Publisher sends them.
func (r *rabbitBench) rawPublish(ctx context.Context, msgs []broker.Message, window int) (float64, error) {
	ch, err := r.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	returns := ch.NotifyReturn(make(chan amqp.Return, window))
	sent, confirmed := 0, 0
	await := func() error {
		select {
		case c, ok := <-confirms:
			if !ok || !c.Ack {
				return fmt.Errorf("raw publish: message %d was not confirmed (channel open: %t)", c.DeliveryTag, ok)
			}
			confirmed++
			return nil
		case ret := <-returns:
			return fmt.Errorf("raw publish: message %s returned: %s", ret.MessageId, ret.ReplyText)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	start := time.Now()
	for _, m := range msgs {
		for sent-confirmed >= window {
			if err := await(); err != nil {
				return 0, err
			}
		}
		headers := amqp.Table{rabbitmq.HeaderKey: m.Key}
		for k, v := range m.Headers {
			headers[k] = v
		}
		err := ch.PublishWithContext(ctx, r.topo.Exchange, m.Topic, true, false, amqp.Publishing{
			Headers: headers, DeliveryMode: amqp.Persistent, MessageId: m.ID, Timestamp: time.Now(), Body: m.Body,
		})
		if err != nil {
			return 0, err
		}
		sent++
	}
	for confirmed < sent {
		if err := await(); err != nil {
			return 0, err
		}
	}
	return time.Since(start).Seconds(), nil
}

// relayRounds splits a relay run into rounds, each measuring the raw rate
// and then the relay on its share of -jobs: the machine's load moves the
// broker's rate during a run, and interleaving exposes both measurements to
// the same load.
const relayRounds = 4

// relayRabbitMQ measures, in one run, the broker's raw confirmed-publish
// rate and the rate of -workers relays publishing outbox events of the same
// shape through the rabbitmq Publisher, with the same window, in
// relayRounds interleaved rounds, and prints both and their ratio.
func (b *bench) relayRabbitMQ(ctx context.Context) (float64, error) {
	r, err := b.newRabbitBench()
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := r.close(b.o.keep); err != nil {
			fmt.Fprintf(b.progress, "llmq bench: deleting %s: %v\n", r.queue(), err)
		}
	}()
	window := cmp.Or(b.o.window, rabbitmq.DefaultWindow)
	p, err := r.publisher(ctx, window)
	if err != nil {
		return 0, err
	}
	defer func() { _ = p.Close() }()
	pub := &timedPublisher{Publisher: p}
	relayPool, trips, err := b.countingPool(ctx)
	if err != nil {
		return 0, err
	}
	defer relayPool.Close()
	var rawSeconds, relaySeconds float64
	rounds := min(relayRounds, b.o.jobs)
	ratios := make([]float64, 0, rounds)
	for round := range rounds {
		n := b.o.jobs / rounds
		if round == rounds-1 {
			n = b.o.jobs - round*n
		}
		events, err := b.writeOutboxEvents(ctx, n)
		if err != nil {
			return 0, err
		}
		fmt.Fprintf(b.progress, "llmq bench: round %d: raw confirmed publishing of %d messages, window %d\n", round+1, n, window)
		raw, err := r.rawPublish(ctx, b.benchMessages(n), window)
		if err != nil {
			return 0, err
		}
		if err := r.purge(); err != nil {
			return 0, err
		}
		relay, err := b.runRelaysOn(ctx, relayPool, events, pub)
		if err != nil {
			return 0, err
		}
		if err := r.checkRelayed(ctx, b, n); err != nil {
			return 0, err
		}
		rawSeconds, relaySeconds = rawSeconds+raw, relaySeconds+relay
		ratios = append(ratios, raw/relay)
	}
	raw, relay := float64(b.o.jobs)/rawSeconds, float64(b.o.jobs)/relaySeconds
	b.report.rabbitMQ(rabbitMQReport{Window: window, Relays: b.o.workers, RawConfirmedPerSecond: raw, RelayPerSecond: relay, RelayToRaw: relay / raw,
		Rounds: ratios, PublishShare: time.Duration(pub.busy.Load()).Seconds() / relaySeconds}) // one relay publishes: the active one
	// Unlike the rates, these do not move with the machine's load. They
	// count every relay's statements, the standbys' lease checks included.
	fmt.Fprintf(b.progress, "llmq bench: the relays' database use per 1,000 events: %.1f round trips, %.1f statements\n",
		1000*float64(trips.roundTrips.Load())/float64(b.o.jobs), 1000*float64(trips.statements.Load())/float64(b.o.jobs))
	return relaySeconds, nil
}

// countingPool is a pool like the bench's whose round trips and
// statements are counted (tripCounter, of the providerbatch mode), for the
// relays.
func (b *bench) countingPool(ctx context.Context) (*pgxpool.Pool, *tripCounter, error) {
	cfg := b.pool.Config()
	trips := &tripCounter{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("llmq bench: the relays' pool: %w", err)
	}
	// The active relay uses two pool connections at once (its claims and
	// its lease renewal): opened now, as the bench's own pool has them open,
	// so that no round's timed part pays for a connection.
	conns := make([]*pgxpool.Conn, 0, 2)
	for range cap(conns) {
		var c *pgxpool.Conn
		if c, err = pool.Acquire(ctx); err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("llmq bench: the relays' pool: %w", err)
	}
	return pool, trips, nil
}

// checkRelayed checks that the relay marked every event published and the
// queue holds the n it received, then empties it.
func (r *rabbitBench) checkRelayed(ctx context.Context, b *bench, n int) error {
	var unpublished int
	if err := b.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+b.schema+".outbox WHERE published_at IS NULL) + (SELECT coalesce(sum(event_count), 0) FROM "+b.schema+".outbox_batches WHERE published_at IS NULL)").Scan(&unpublished); err != nil {
		return err
	}
	depth, err := r.depth()
	switch {
	case err != nil:
		return err
	case unpublished > 0:
		return fmt.Errorf("llmq bench: %d events were not confirmed by the broker", unpublished)
	case depth < n:
		return fmt.Errorf("llmq bench: the queue holds %d of %d events", depth, n)
	}
	return r.purge()
}

// timedPublisher sums the time relays spend inside Publish.
type timedPublisher struct {
	broker.Publisher
	busy atomic.Int64 // a time.Duration
}

func (p *timedPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	start := time.Now()
	defer func() { p.busy.Add(int64(time.Since(start))) }()
	return p.Publisher.Publish(ctx, msgs)
}
