package rabbitmq

import (
	"cmp"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/validate"
)

// QueueType selects a queue implementation.
type QueueType string

const (
	// Quorum queues are replicated (Raft), durable, and dead-letter at least
	// once. The default.
	Quorum QueueType = "quorum"
	// Classic queues are single-node; their dead-lettering is at most once.
	Classic QueueType = "classic"
)

// maxNameLen is AMQP's limit on exchange and queue names and routing keys
// (a short string).
const maxNameLen = 255

// Topology is an exchange and the queues bound to it, each with its own
// dead-letter exchange and queue. Declaring it is idempotent; declaring it
// with different arguments than an existing queue fails (the broker closes
// the channel with PRECONDITION_FAILED), so change arguments by new names.
type Topology struct {
	// Exchange is the durable exchange publishers send to. Empty means the
	// default exchange: routing keys are queue names and nothing is
	// declared for it.
	Exchange string
	// ExchangeKind is "topic" (default), "direct", "fanout" or "headers".
	ExchangeKind string
	// Queues are declared and bound to Exchange.
	Queues []Queue
}

// Queue is one durable queue of a Topology.
type Queue struct {
	// Name of the queue. Required.
	Name string
	// Bindings are the routing keys (patterns for a topic exchange) that
	// bind the queue to the Topology's exchange. Default: the queue's name.
	// Ignored for the default exchange.
	Bindings []string
	// Type is Quorum (default) or Classic.
	Type QueueType
	// DeadLetterExchange receives rejected messages, and those over
	// DeliveryLimit; it is a durable fanout exchange bound to
	// DeadLetterQueue. Defaults: Name+".dlx" and Name+".dlq".
	DeadLetterExchange, DeadLetterQueue string
	// DeliveryLimit dead-letters a message handed back (nacked, or its
	// consumer's channel closed) more than this many times, so that it is
	// delivered at most DeliveryLimit+1 times (quorum queues only;
	// x-delivery-limit). 0: no limit set, which on RabbitMQ 4 means its
	// default of 20. A Consumer whose ConnConfig.Topology declares the
	// queue takes its limit from here; see ConsumerConfig.DeliveryLimit.
	DeliveryLimit int
	// MaxLength bounds the queue's ready messages. Publishes beyond it are
	// refused (x-overflow reject-publish: the publisher sees a nack and
	// retries), never dropped. 0: unbounded.
	MaxLength int
}

// DeadLetterNames returns the queue's dead-letter exchange and queue.
func (q Queue) DeadLetterNames() (exchange, queue string) {
	return cmp.Or(q.DeadLetterExchange, q.Name+".dlx"), cmp.Or(q.DeadLetterQueue, q.Name+".dlq")
}

// Validate reports the first thing wrong with t, as a *llmqtype.ValidationError
// matching ErrInvalidConfig.
func (t Topology) Validate() error {
	fail := func(field, problem string) error {
		return &validate.Error{Kind: ErrInvalidConfig, Field: field, Problem: problem}
	}
	if p := validate.Text(t.Exchange, false, maxNameLen); p != "" {
		return fail("Topology.Exchange", p)
	}
	switch t.ExchangeKind {
	case "", amqp.ExchangeTopic, amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeHeaders:
	default:
		return fail("Topology.ExchangeKind", fmt.Sprintf("is %q; use topic, direct, fanout or headers", t.ExchangeKind))
	}
	for i, q := range t.Queues {
		field := fmt.Sprintf("Topology.Queues[%d]", i)
		dlx, dlq := q.DeadLetterNames()
		for name, v := range map[string]string{".Name": q.Name, ".DeadLetterExchange": dlx, ".DeadLetterQueue": dlq} {
			if p := validate.Text(v, true, maxNameLen); p != "" {
				return fail(field+name, p)
			}
		}
		for j, b := range q.Bindings {
			if p := validate.Text(b, false, maxNameLen); p != "" {
				return fail(fmt.Sprintf("%s.Bindings[%d]", field, j), p)
			}
		}
		switch {
		case q.Type != "" && q.Type != Quorum && q.Type != Classic:
			return fail(field+".Type", fmt.Sprintf("is %q; use quorum or classic", q.Type))
		case q.DeliveryLimit < 0 || q.MaxLength < 0:
			return fail(field, "DeliveryLimit and MaxLength must not be negative")
		case q.DeliveryLimit > 0 && q.Type == Classic:
			return fail(field+".DeliveryLimit", "is only supported by quorum queues")
		}
	}
	return nil
}

// arguments are the x-arguments of q's declaration.
func (q Queue) arguments() amqp.Table {
	dlx, _ := q.DeadLetterNames()
	args := amqp.Table{"x-dead-letter-exchange": dlx}
	if q.MaxLength > 0 {
		args["x-max-length"] = int64(q.MaxLength)
	}
	if q.Type == Classic {
		if q.MaxLength > 0 {
			args["x-overflow"] = "reject-publish"
		}
		return args
	}
	args[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
	// At-least-once dead-lettering keeps a message in the source queue
	// until the dead-letter queue confirmed it; RabbitMQ only honours it
	// with reject-publish overflow (drop-head would silently discard).
	args["x-dead-letter-strategy"] = "at-least-once"
	args["x-overflow"] = "reject-publish"
	if q.DeliveryLimit > 0 {
		args["x-delivery-limit"] = int64(q.DeliveryLimit)
	}
	return args
}

// Declare declares t on ch: the exchange, then for each queue its
// dead-letter exchange and queue, the queue itself and its bindings.
func (t Topology) Declare(ch *amqp.Channel) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if t.Exchange != "" {
		if err := ch.ExchangeDeclare(t.Exchange, cmp.Or(t.ExchangeKind, amqp.ExchangeTopic), true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: declaring exchange %s: %w", t.Exchange, err)
		}
	}
	for _, q := range t.Queues {
		dlx, dlq := q.DeadLetterNames()
		dlqArgs := amqp.Table{}
		if q.Type != Classic {
			dlqArgs[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
		}
		if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: declaring dead-letter exchange %s: %w", dlx, err)
		}
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, dlqArgs); err != nil {
			return fmt.Errorf("rabbitmq: declaring dead-letter queue %s: %w", dlq, err)
		}
		if err := ch.QueueBind(dlq, "", dlx, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: binding %s to %s: %w", dlq, dlx, err)
		}
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.arguments()); err != nil {
			return fmt.Errorf("rabbitmq: declaring queue %s: %w", q.Name, err)
		}
		if t.Exchange == "" {
			continue
		}
		keys := q.Bindings
		if len(keys) == 0 {
			keys = []string{q.Name}
		}
		for _, key := range keys {
			if err := ch.QueueBind(q.Name, key, t.Exchange, false, nil); err != nil {
				return fmt.Errorf("rabbitmq: binding %s to %s with %q: %w", q.Name, t.Exchange, key, err)
			}
		}
	}
	return nil
}

// Delete deletes what Declare declared, messages included.
func (t Topology) Delete(ch *amqp.Channel) error {
	for _, q := range t.Queues {
		dlx, dlq := q.DeadLetterNames()
		for _, name := range []string{q.Name, dlq} {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				return fmt.Errorf("rabbitmq: deleting queue %s: %w", name, err)
			}
		}
		if err := ch.ExchangeDelete(dlx, false, false); err != nil {
			return fmt.Errorf("rabbitmq: deleting exchange %s: %w", dlx, err)
		}
	}
	if t.Exchange != "" {
		if err := ch.ExchangeDelete(t.Exchange, false, false); err != nil {
			return fmt.Errorf("rabbitmq: deleting exchange %s: %w", t.Exchange, err)
		}
	}
	return nil
}

// declareOn declares t on a short-lived channel of conn: a failed
// declaration closes only that channel.
func (t Topology) declareOn(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: opening a channel to declare the topology: %w", err)
	}
	defer func() { _ = ch.Close() }()
	return t.Declare(ch)
}
