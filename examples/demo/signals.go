package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/outbox"
)

// signals carries the job store's lifecycle events off Postgres through a
// broker: the outbox relay publishes them once committed, and an inbox ingress
// accepts each event id once, recording it in the demo's own table in the
// inbox's transaction. The table's primary key would refuse a second
// effect, so its row count, equal to the outbox's job events, shows each event
// arrived once. A "<kind>.requested" event also wakes the runner for the
// job's queue: with a broker the runner does not LISTEN (stackConfig.Broker),
// so this is how accepted work reaches the workers before the next poll.
type signals struct {
	s       *stack
	broker  string
	relay   *outbox.Relay
	cancel  context.CancelFunc
	done    chan error
	cleanup func()
}

const signalConsumer = "demo-signals"

// startSignals starts the relay and the ingress on kind: "memory" (the
// in-process default), "rabbitmq" at amqpURL, or "kafka" (the brokers in
// KAFKA_BROKERS, else an in-process kfake cluster).
func startSignals(ctx context.Context, s *stack, kind, amqpURL string) (*signals, error) {
	topic := s.svc.Jobs.Config().EventTopic
	if _, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.demo_signals (event_id text PRIMARY KEY, type text NOT NULL)`, pgIdent(s.schema))); err != nil {
		return nil, err
	}
	var (
		pub     broker.Publisher
		cons    broker.Consumer
		cleanup func()
	)
	switch kind {
	case "memory":
		mem := memory.New(memory.Config{})
		pub, cons, cleanup = mem.Publisher(), mem.Consumer(topic), func() { _ = mem.Close() }
	case "rabbitmq":
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		name := "llmq.demo." + hex.EncodeToString(suffix)
		topo := rabbitmq.Topology{Exchange: name, Queues: []rabbitmq.Queue{{Name: name, Bindings: []string{topic}}}}
		conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return nil, fmt.Errorf("connecting to rabbitmq: %w", err)
		}
		withChannel := func(fn func(*amqp.Channel) error) error {
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			defer func() { _ = ch.Close() }()
			return fn(ch)
		}
		if err := withChannel(topo.Declare); err != nil {
			_ = conn.Close()
			return nil, err
		}
		p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: rabbitmq.ConnConfig{URL: amqpURL, Name: "llmq-demo-relay"}, Exchange: name})
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: rabbitmq.ConnConfig{URL: amqpURL, Name: "llmq-demo-ingress"}, Queue: name})
		if err != nil {
			_ = p.Close()
			_ = conn.Close()
			return nil, err
		}
		pub, cons = p, c
		cleanup = func() {
			_ = c.Close()
			_ = p.Close()
			_ = withChannel(topo.Delete)
			_ = conn.Close()
		}
	case "kafka":
		var err error
		if pub, cons, cleanup, err = kafkaSignals(ctx, topic); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("-broker %q: memory, rabbitmq, kafka or none", kind)
	}
	// The service's publisher sends the uploads' webhooks before it hands
	// every event on to the broker.
	relay, err := s.svc.NewEventRelay(pub, outbox.RelayConfig{PollInterval: 100 * time.Millisecond})
	if err != nil {
		cleanup()
		return nil, err
	}
	in, err := inbox.NewStore(inbox.Config{Schema: s.schema})
	if err != nil {
		cleanup()
		return nil, err
	}
	insert := fmt.Sprintf(`INSERT INTO %s.demo_signals (event_id, type) VALUES ($1, $2)`, pgIdent(s.schema))
	ingress, err := in.NewIngress(s.pool, cons, inbox.IngressConfig{
		Consumer: signalConsumer,
		Handler: func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
			eventType := msg.Headers[outbox.HeaderEventType]
			if _, err := tx.Exec(ctx, insert, msg.ID, eventType); err != nil {
				return err
			}
			if strings.HasSuffix(eventType, ".requested") {
				// Before the commit, and that is fine: the job committed
				// long before its event was published, and a wake-up is
				// only a hint to claim now.
				var ev struct {
					Queue string `json:"queue"`
				}
				if json.Unmarshal(msg.Body, &ev) == nil {
					s.runner.Wake(ev.Queue)
				}
			}
			return nil
		},
	})
	if err != nil {
		cleanup()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sig := &signals{s: s, broker: kind, relay: relay, cancel: cancel, done: make(chan error, 2), cleanup: cleanup}
	go func() { sig.done <- relay.Run(runCtx) }()
	go func() { sig.done <- ingress.Run(runCtx) }()
	return sig, nil
}

// counts returns the job events in the outbox (both of its tables: the job
// store writes a statement's events as one batch row when there are
// several), those not yet published, and those the ingress accepted.
func (g *signals) counts(ctx context.Context) (written, pending, accepted int64, err error) {
	topic := g.s.svc.Jobs.Config().EventTopic
	err = g.s.pool.QueryRow(ctx, fmt.Sprintf(
		`SELECT (SELECT count(*) FROM %[1]s.outbox WHERE topic = $1)
		            + (SELECT count(*) FROM %[1]s.outbox_batches AS b, json_array_elements(b.events) AS e
		               WHERE e ->> 'topic' = $1 AND (e ->> 'seq')::bigint <> ALL (b.split)),
		        (SELECT count(*) FROM %[1]s.outbox WHERE topic = $1 AND published_at IS NULL)
		            + (SELECT count(*) FROM %[1]s.outbox_batches AS b, json_array_elements(b.events) AS e
		               WHERE b.published_at IS NULL AND e ->> 'topic' = $1),
		        (SELECT count(*) FROM %[1]s.demo_signals)`, pgIdent(g.s.schema)), topic).Scan(&written, &pending, &accepted)
	return written, pending, accepted, err
}

// stop ends the relay and the ingress and releases the broker; it returns
// what they returned.
func (g *signals) stop() error {
	g.cancel()
	err := errors.Join(<-g.done, <-g.done)
	g.cleanup()
	return err
}
