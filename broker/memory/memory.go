package memory

import (
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/llmq/llmq/broker"
)

// ErrInvalidMessage fails a message Publish refuses before it reaches a
// queue: one without an ID or a Topic.
var ErrInvalidMessage = errors.New("memory: invalid message")

// ErrAlreadySettled is returned by Ack, Nack or Reject on a delivery that
// already had its verdict: the contract allows exactly one.
var ErrAlreadySettled = errors.New("memory: delivery already settled")

// Config tunes a Broker. The zero Config is a broker that confirms every
// valid message and redelivers Nacked messages at once.
type Config struct {
	// FailPublish, when set, is asked about every valid message Publish
	// receives, in call order; a non-nil error fails that message (it is
	// reported in a *broker.PublishError, wrapped) and it is not enqueued.
	// It is for fault-injection tests ("30% of publishes fail"). Invalid
	// messages fail validation first and never reach it. It must be safe for
	// concurrent use; it runs outside the broker's lock, so it may call the
	// Broker.
	FailPublish func(broker.Message) error
	// RedeliveryDelay is how long a Nacked message waits before it can be
	// received again; later messages with its key wait with it. Default 0:
	// at once.
	RedeliveryDelay time.Duration
}

// Broker is an in-process broker. Create it with New; it needs no other
// setup, and Close releases every blocked Receive.
type Broker struct {
	cfg  Config
	done chan struct{} // closed by Close: wakes every blocked Receive

	mu     sync.Mutex
	closed bool
	seq    uint64 // publish order across all topics
	topics map[string]*topic
}

// New returns an empty broker.
func New(cfg Config) *Broker {
	return &Broker{cfg: cfg, done: make(chan struct{}), topics: map[string]*topic{}}
}

// Publisher returns a new publisher. A broker hands out any number; each is
// safe for concurrent use, and closing one does not affect the others.
func (b *Broker) Publisher() broker.Publisher {
	return &publisher{b: b}
}

// Consumer returns a new consumer of topic's queue. Consumers of the same
// topic compete: each message goes to one of them at a time, as with several
// consumers of one RabbitMQ queue. A consumer created after Close is closed.
func (b *Broker) Consumer(topic string) broker.Consumer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &consumer{
		b:      b,
		topic:  b.topic(topic),
		held:   map[*Delivery]struct{}{},
		closed: b.closed,
		done:   make(chan struct{}),
	}
}

// DeadLetters returns the messages Reject sent to topic's dead-letter path,
// in the order they were rejected. It works after Close too, so a test can
// check them after shutting down.
func (b *Broker) DeadLetters(topic string) []broker.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.topics[topic]
	if !ok || len(t.dead) == 0 {
		return nil
	}
	out := make([]broker.Message, len(t.dead))
	for i, m := range t.dead {
		out[i] = cloneMessage(m)
	}
	return out
}

// Published returns how many messages were confirmed for topic since the
// broker was created, whether or not they have been consumed since.
func (b *Broker) Published(topic string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.topics[topic]; ok {
		return t.published
	}
	return 0
}

// Close closes the broker and everything it handed out: Publish and Receive
// return broker.ErrClosed, blocked Receive calls included, and settling a
// delivery fails. Unsettled messages are dropped with the rest of the
// broker's state, as a real broker's would be if it lost its storage;
// DeadLetters and Published still answer. Close is idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.done)
	}
	return nil
}

func (b *Broker) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// topic returns topic's queue, creating it on first use. The caller holds
// b.mu.
func (b *Broker) topic(name string) *topic {
	t, ok := b.topics[name]
	if !ok {
		t = newTopic(name)
		b.topics[name] = t
	}
	return t
}

// cloneMessage copies the parts of m a holder could modify in place, so the
// broker's copy stays what was published. A nil Body becomes empty: this
// broker has no null payload, and the contract delivers nil only for one.
func cloneMessage(m broker.Message) broker.Message {
	m.Headers = maps.Clone(m.Headers)
	m.Body = append([]byte{}, m.Body...)
	return m
}
