package kafka

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
)

// Publisher is a broker.Publisher producing to Kafka: idempotent, acks from
// every in-sync replica, the message key as the record key.
type Publisher struct {
	cl     *kgo.Client
	closed atomic.Bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg and returns a publisher. The client connects
// lazily: an unreachable cluster shows as failed messages, not here.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(cfg.producerOpts(), cfg.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Publisher{cl: cl}, nil
}

// Publish produces msgs and waits for the brokers' acknowledgement of each.
// It returns nil only when every record was acknowledged by all in-sync
// replicas; otherwise a *broker.PublishError names the messages that were
// not, and all others were. A message without ID or Topic fails with
// ErrInvalidMessage and is not produced.
//
// Messages sharing a Key are produced one after another, each once the one
// before it is acknowledged; if one fails, the key's later messages are not
// produced and fail with ErrEarlierFailed. A key's messages therefore reach
// Kafka in order, with no gap, whatever fails. Messages of different keys,
// and those without a key, are produced concurrently.
//
// When ctx ends first, the unacknowledged messages are reported failed
// with ctx's error; some of them may still reach the broker, which the
// outbox relay makes a duplicate, never a loss.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kafka: publish: %w", err)
	}
	failed := map[int]error{}
	chains := map[string][]int{} // by key: indexes in call order, the head in flight
	var heads []int
	for i, msg := range msgs {
		switch {
		case msg.ID == "" || msg.Topic == "":
			failed[i] = fmt.Errorf("%w: message %d needs an ID and a Topic", ErrInvalidMessage, i)
		case msg.Key == "":
			heads = append(heads, i)
		default:
			if len(chains[msg.Key]) == 0 {
				heads = append(heads, i)
			}
			chains[msg.Key] = append(chains[msg.Key], i)
		}
	}
	type result struct {
		i   int
		err error
	}
	// Buffered for every message, so that a promise never blocks, even
	// after Publish returned on ctx.
	results := make(chan result, len(msgs))
	produce := func(i int) {
		p.cl.Produce(ctx, toRecord(msgs[i]), func(_ *kgo.Record, err error) { results <- result{i, err} })
	}
	slices.Sort(heads)
	for _, i := range heads {
		produce(i)
	}
	finished := make([]bool, len(msgs))
	for outstanding := len(heads); outstanding > 0; outstanding-- {
		var r result
		select {
		case r = <-results:
		case <-ctx.Done():
			for i := range msgs {
				if !finished[i] && failed[i] == nil {
					failed[i] = fmt.Errorf("kafka: producing %q: %w", msgs[i].ID, ctx.Err())
				}
			}
			return &broker.PublishError{Failed: failed}
		}
		finished[r.i] = true
		key := msgs[r.i].Key
		var rest []int
		if key != "" {
			rest = chains[key][1:]
			chains[key] = rest
		}
		switch {
		case r.err != nil:
			failed[r.i] = fmt.Errorf("kafka: producing %q to %s: %w", msgs[r.i].ID, msgs[r.i].Topic, r.err)
			for _, j := range rest {
				failed[j] = fmt.Errorf("kafka: %q not produced: %w (%q)", msgs[j].ID, ErrEarlierFailed, msgs[r.i].ID)
			}
		case len(rest) > 0:
			produce(rest[0])
			outstanding++
		}
	}
	if len(failed) > 0 {
		return &broker.PublishError{Failed: failed}
	}
	return nil
}

// Close fails what is still buffered and closes the client. Publish after
// Close returns broker.ErrClosed.
func (p *Publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.cl.Close()
	return nil
}
