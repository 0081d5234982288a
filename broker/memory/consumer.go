package memory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/broker"
)

// consumer is a Broker's broker.Consumer of one topic's queue.
type consumer struct {
	b     *Broker
	topic *topic
	done  chan struct{} // closed by Close: wakes this consumer's blocked Receive calls

	// Guarded by b.mu.
	closed bool
	held   map[*Delivery]struct{} // delivered to this consumer, not yet settled
}

// Receive takes the ready message that was published first, waiting until
// there is one, ctx ends, or the consumer or broker is closed
// (broker.ErrClosed). It waits on a channel the topic closes whenever a
// message becomes ready, and on a timer for the earliest message waiting out
// its redelivery delay, so it never polls.
func (c *consumer) Receive(ctx context.Context) (broker.Delivery, error) {
	if c.topic.name == "" {
		return nil, errors.New("memory: receive: the consumer's topic is empty, and no message can have an empty topic")
	}
	b := c.b
	for {
		b.mu.Lock()
		if b.closed || c.closed {
			b.mu.Unlock()
			return nil, broker.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("memory: receive from %q: %w", c.topic.name, err)
		}
		if e := c.topic.take(time.Now()); e != nil {
			d := &Delivery{c: c, e: e, msg: cloneMessage(e.msg), attempt: e.attempts}
			c.held[d] = struct{}{}
			b.mu.Unlock()
			return d, nil
		}
		changed, next, delayed := c.topic.waitFor()
		b.mu.Unlock()

		var timer *time.Timer
		var ready <-chan time.Time
		if delayed {
			timer = time.NewTimer(time.Until(next))
			ready = timer.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-ready:
		case <-c.done:
		case <-b.done:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// Close stops the consumer: Receive returns broker.ErrClosed, and every
// delivery it holds unsettled is put back to be delivered again at once, as
// if its connection had dropped, ahead of its key's later messages. Settling
// one of those deliveries afterwards fails with broker.ErrClosed. Close is
// idempotent.
func (c *consumer) Close() error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	close(c.done)
	now := time.Now()
	for d := range c.held {
		d.released = true
		c.topic.requeue(d.e, now, now)
	}
	clear(c.held)
	return nil
}

// Delivery is the memory broker's broker.Delivery. Beyond the contract it
// reports its attempt number, which tests use to see redelivery happen.
type Delivery struct {
	c       *consumer
	e       *entry
	msg     broker.Message // the receiver's copy
	attempt int

	// Guarded by c.b.mu.
	settled  bool // Ack, Nack or Reject succeeded
	released bool // its consumer closed first and put the message back
}

var _ broker.Delivery = (*Delivery)(nil)

// Message returns the delivered message. It is the receiver's own copy:
// changing it changes neither a redelivery nor DeadLetters.
func (d *Delivery) Message() broker.Message { return d.msg }

// Source names the topic's queue, which in this broker is the topic.
func (d *Delivery) Source() broker.Source { return broker.Source{Queue: d.c.topic.name} }

// Attempt returns how many times the message has been delivered, this
// delivery included: 1 the first time. It is specific to the memory broker
// (RabbitMQ reports only a redelivered flag, Kafka nothing), so code meant
// for any broker must not depend on it; tests use it to watch redelivery.
func (d *Delivery) Attempt() int { return d.attempt }

// Ack retires the message for good and lets the next message of its key be
// delivered.
func (d *Delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func(t *topic, _ time.Time) { t.done(d.e) })
}

// Nack puts the message back at the front of its key's order, to be
// delivered again, to any consumer of the topic, after
// Config.RedeliveryDelay. The key's later messages wait for it.
func (d *Delivery) Nack(ctx context.Context) error {
	return d.settle(ctx, "nack", func(t *topic, now time.Time) {
		t.requeue(d.e, now.Add(d.c.b.cfg.RedeliveryDelay), now)
	})
}

// Reject moves the message to the topic's dead-letter list (see
// Broker.DeadLetters) and lets the next message of its key be delivered. The
// memory broker does not keep reason; a real broker's dead-letter path
// records it only if its adapter puts it in a header.
func (d *Delivery) Reject(ctx context.Context, reason error) error {
	return d.settle(ctx, "reject", func(t *topic, _ time.Time) {
		t.dead = append(t.dead, d.e.msg)
		t.done(d.e)
	})
}

// settle applies a verdict once. A verdict that fails (a second verdict, one
// after Close) changes nothing. The context is not consulted: a verdict
// takes effect at once, as RabbitMQ's do, so one given with an ended
// context (a shutdown's, a settle deadline that passed) is not lost, which
// would hold the message, and its key's later ones, until Close.
func (d *Delivery) settle(_ context.Context, verdict string, apply func(t *topic, now time.Time)) error {
	b := d.c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case d.settled:
		return fmt.Errorf("memory: %s message %q: %w", verdict, d.msg.ID, ErrAlreadySettled)
	case d.released:
		return fmt.Errorf("memory: %s message %q: its consumer was closed, so it will be delivered again: %w", verdict, d.msg.ID, broker.ErrClosed)
	case b.closed:
		return fmt.Errorf("memory: %s message %q: the broker was closed: %w", verdict, d.msg.ID, broker.ErrClosed)
	}
	d.settled = true
	delete(d.c.held, d)
	apply(d.c.topic, time.Now())
	return nil
}
