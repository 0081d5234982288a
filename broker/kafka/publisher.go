package kafka

import (
	"context"
	"fmt"
	"sync"
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

// Publish produces msgs, in order, and waits for the brokers'
// acknowledgement of each. It returns nil only when every record was
// acknowledged by all in-sync replicas; otherwise a *broker.PublishError
// names the messages that were not, and all others were. A message without
// ID or Topic fails with ErrInvalidMessage and is not produced.
//
// Records of one partition fail gaplessly for retriable errors and
// timeouts: the client fails every later record it buffered for that
// partition too, so a key's later message is never confirmed after its
// earlier one failed. A record the broker refuses outright (too large,
// invalid) fails alone.
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
	var (
		mu        sync.Mutex
		failed    = map[int]error{}
		finished  = make([]bool, len(msgs))
		abandoned bool // ctx ended: results arriving later are not reported
		wg        sync.WaitGroup
	)
	for i, msg := range msgs {
		if msg.ID == "" || msg.Topic == "" {
			failed[i] = fmt.Errorf("%w: message %d needs an ID and a Topic", ErrInvalidMessage, i)
			finished[i] = true
			continue
		}
		wg.Add(1)
		p.cl.Produce(ctx, toRecord(msg), func(_ *kgo.Record, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if abandoned {
				return
			}
			finished[i] = true
			if err != nil {
				failed[i] = fmt.Errorf("kafka: producing %q to %s: %w", msg.ID, msg.Topic, err)
			}
		})
	}
	all := make(chan struct{})
	go func() {
		wg.Wait()
		close(all)
	}()
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		abandoned = true
		for i, ok := range finished {
			if !ok {
				failed[i] = fmt.Errorf("kafka: producing %q: %w", msgs[i].ID, ctx.Err())
			}
		}
		mu.Unlock()
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
