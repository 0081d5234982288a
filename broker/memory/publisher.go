package memory

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/llmq/llmq/broker"
)

// publisher is a Broker's broker.Publisher. It holds no connection, so Close
// only stops it from publishing.
type publisher struct {
	b      *Broker
	closed atomic.Bool
}

// Publish confirms each valid message that Config.FailPublish lets through
// by appending it to its topic's queue; the others are reported in a
// *broker.PublishError. The accepted messages of one call are enqueued
// together, in call order, so concurrent calls never interleave within a
// key. If the publisher or broker is closed, or ctx ends before the messages
// are enqueued, Publish returns broker.ErrClosed or the context's error and
// enqueues none, as the contract requires of any error that is not a
// *broker.PublishError.
func (p *publisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if p.closed.Load() || p.b.isClosed() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: publish: %w", err)
	}
	var failed map[int]error
	fail := func(i int, err error) {
		if failed == nil {
			failed = map[int]error{}
		}
		failed[i] = err
	}
	accepted := make([]*entry, 0, len(msgs))
	for i, m := range msgs {
		if err := validate(m); err != nil {
			fail(i, err)
			continue
		}
		// Copied before FailPublish sees it: neither the hook nor the caller
		// may change the queued message by keeping a reference.
		m = cloneMessage(m)
		if p.b.cfg.FailPublish != nil {
			if err := p.b.cfg.FailPublish(cloneMessage(m)); err != nil {
				fail(i, fmt.Errorf("memory: message %q not confirmed: %w", m.ID, err))
				continue
			}
		}
		accepted = append(accepted, &entry{msg: m})
	}

	b := p.b
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return broker.ErrClosed
	}
	// FailPublish may have taken a while: the context is checked again under
	// the lock, where enqueueing can no longer be interrupted.
	if err := ctx.Err(); err != nil {
		b.mu.Unlock()
		return fmt.Errorf("memory: publish: %w", err)
	}
	for _, e := range accepted {
		b.seq++
		e.seq = b.seq
		b.topic(e.msg.Topic).enqueue(e)
	}
	b.mu.Unlock()

	if failed != nil {
		return &broker.PublishError{Failed: failed}
	}
	return nil
}

// Close stops the publisher; later Publish calls return broker.ErrClosed.
// It is idempotent.
func (p *publisher) Close() error {
	p.closed.Store(true)
	return nil
}

// validate refuses what no real broker adapter could route or deduplicate.
func validate(m broker.Message) error {
	switch {
	case m.ID == "":
		return fmt.Errorf("%w: ID is empty (topic %q)", ErrInvalidMessage, m.Topic)
	case m.Topic == "":
		return fmt.Errorf("%w %q: Topic is empty", ErrInvalidMessage, m.ID)
	}
	return nil
}
