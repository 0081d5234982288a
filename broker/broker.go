package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Message is one event on the wire.
type Message struct {
	// ID identifies the message everywhere: the outbox event ID, the
	// RabbitMQ message-id, a Kafka header. Receivers deduplicate on it.
	ID string
	// Topic routes the message: a Kafka topic, a RabbitMQ routing key.
	Topic string
	// Key orders messages: those sharing a key keep their publish order
	// (Kafka partition key, RabbitMQ consistent-hash or single active
	// consumer). Optional; a null key is received as "".
	Key string
	// Headers travel with the message (trace context, event type). One
	// value per key: a header repeated on the wire is received with its
	// last value, a null value as "". Keys and values hold any bytes as
	// received; receivers decide what they accept (package inbox refuses
	// invalid UTF-8 and NUL).
	Headers map[string]string
	// Body is the payload, usually JSON. A received Body is nil only for a
	// null payload (a Kafka tombstone), and non-nil, if empty, otherwise;
	// a nil Body is published as an empty payload.
	Body []byte
}

// Publisher sends messages and waits for the broker's confirmation.
type Publisher interface {
	// Publish sends msgs and returns once every one is confirmed (nil) or
	// known not to be. If some failed, the error is a *PublishError naming
	// them, and every message it does not name was confirmed; any other
	// error means none may be assumed confirmed. Publish honours ctx: on
	// expiry, unconfirmed messages are failures.
	Publish(ctx context.Context, msgs []Message) error
	// Close releases the publisher's connections.
	Close() error
}

// PublishError reports the messages of one Publish call that were not
// confirmed; the rest were.
type PublishError struct {
	// Failed maps an index into the msgs given to Publish to why it failed.
	Failed map[int]error
}

func (e *PublishError) Error() string {
	idx := make([]int, 0, len(e.Failed))
	for i := range e.Failed {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	parts := make([]string, 0, min(len(idx), 3))
	for _, i := range idx[:min(len(idx), 3)] {
		parts = append(parts, fmt.Sprintf("message %d: %v", i, e.Failed[i]))
	}
	more := ""
	if len(idx) > 3 {
		more = fmt.Sprintf(" (and %d more)", len(idx)-3)
	}
	return fmt.Sprintf("broker: %d messages not confirmed: %s%s", len(idx), strings.Join(parts, "; "), more)
}

// Unwrap exposes the individual failures to errors.Is and errors.As.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, 0, len(e.Failed))
	for _, err := range e.Failed {
		errs = append(errs, err)
	}
	return errs
}

// Failures returns, for each message given to Publish, why it failed, or
// nil if it was confirmed. It reads any error Publish returned: a
// *PublishError fails only the messages it names; any other error fails
// them all.
func Failures(n int, err error) []error {
	out := make([]error, n)
	if err == nil {
		return out
	}
	var pe *PublishError
	if !errors.As(err, &pe) {
		for i := range out {
			out[i] = err
		}
		return out
	}
	for i, e := range pe.Failed {
		if i >= 0 && i < n {
			out[i] = e
		}
	}
	return out
}

// Source says where a delivery came from, for the inbox's records: a queue
// (RabbitMQ, the memory broker) or a topic, partition and offset (Kafka).
type Source struct {
	Queue     string `json:"queue,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition int32  `json:"partition,omitempty"`
	Offset    int64  `json:"offset,omitempty"`
}

// Consumer receives deliveries.
type Consumer interface {
	// Receive blocks until a delivery is available, ctx ends, or the
	// consumer is closed (ErrClosed).
	Receive(ctx context.Context) (Delivery, error)
	// Close stops receiving. Deliveries not yet acknowledged or rejected
	// are delivered again, to this consumer group or queue's next reader.
	Close() error
}

// Delivery is one received message awaiting its receiver's verdict. Call
// exactly one of Ack, Nack and Reject, after the outcome is durable.
type Delivery interface {
	Message() Message
	Source() Source
	// Ack confirms the message was durably accepted: it will not be
	// delivered again.
	Ack(ctx context.Context) error
	// Nack hands the message back to be delivered again later: a transient
	// failure.
	Nack(ctx context.Context) error
	// Reject refuses the message for good (malformed, permanently
	// unprocessable): it goes to the broker's dead-letter path, not back to
	// a consumer.
	Reject(ctx context.Context, reason error) error
}

// LimitedDelivery is a Delivery from a broker that gives up on a message
// handed back too often: after its last allowed delivery, a Nack (or the
// consumer closing before a verdict) ends the message on the broker's
// dead-letter path, or discards it, instead of delivering it again, with
// no say of the receiver's. RabbitMQ's quorum queues with a delivery limit
// do this. A receiver that keeps a record of every message it lets go
// (package inbox) checks for this interface and settles a message's last
// delivery itself.
type LimitedDelivery interface {
	Delivery
	// DeliveryAttempt returns which delivery of the message this is, 1 for
	// the first, and the most deliveries the broker makes, 0 for no limit.
	// If limit > 0 and attempt >= limit, handing the message back ends it.
	DeliveryAttempt() (attempt, limit int)
}

// ErrClosed is returned by a Publisher or Consumer used after Close.
var ErrClosed = errors.New("broker: closed")
