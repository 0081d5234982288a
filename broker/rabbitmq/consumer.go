package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/validate"
)

// Consumer defaults and limits.
const (
	DefaultPrefetch     = 256
	MaxPrefetch         = 65535
	DefaultRequeueDelay = time.Second
)

// ErrSettled is returned by a second Ack, Nack or Reject of one delivery.
var ErrSettled = errors.New("rabbitmq: delivery already settled")

// ConsumerConfig configures a Consumer. Zero values mean the documented
// defaults.
type ConsumerConfig struct {
	ConnConfig
	// Queue to consume. Required; declare it with ConnConfig.Topology or
	// beforehand.
	Queue string
	// Prefetch bounds the deliveries handed to this consumer and not yet
	// settled: the ingress work in flight into the database, not how many
	// models run. Default 256.
	Prefetch int
	// RequeueDelay is how long a Nacked delivery is held before it goes
	// back to the queue, so a transient failure is not retried in a hot
	// loop. It occupies a prefetch slot meanwhile. Default 1s.
	RequeueDelay time.Duration
	// DeliveryLimit is the queue's delivery limit: its x-delivery-limit
	// argument or delivery-limit policy. The broker dead-letters a message
	// handed back more often than that, so it is delivered at most
	// DeliveryLimit+1 times. Deliveries report their attempt against it
	// (broker.LimitedDelivery), and package inbox quarantines a message on
	// its last delivery instead of nacking it into a dead-lettering it
	// would not record. It must not exceed the queue's: a higher value lets
	// the broker dead-letter messages before the ingress sees their last
	// delivery, a lower one only quarantines them sooner.
	//
	// 0 takes the Queue.DeliveryLimit of ConnConfig.Topology's queue of
	// this name, if the topology declares it with one, and otherwise the
	// broker's default, read on each connection: 20 from RabbitMQ 4.0 on
	// (which gives a quorum queue without a limit of its own that one;
	// classic queues count no deliveries, so theirs never run out), none
	// before. NoDeliveryLimit says the queue has none, such as a RabbitMQ 4
	// queue whose limit a policy of -1 lifted.
	DeliveryLimit int
}

// Consumer is a broker.Consumer of one queue, with manual acknowledgement,
// on its own connection, redialled when lost. Receive is safe for
// concurrent callers.
type Consumer struct {
	cfg     ConsumerConfig
	sup     *supervisor
	out     chan *Delivery
	closing chan struct{}
	once    sync.Once

	timersMu sync.Mutex
	timers   map[*time.Timer]struct{} // delayed requeues
}

var _ broker.Consumer = (*Consumer)(nil)

// NewConsumer validates cfg and starts consuming in the background.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	conn, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig = conn
	if p := validate.Text(cfg.Queue, true, maxNameLen); p != "" {
		return nil, &validate.Error{Kind: ErrInvalidConfig, Field: "Queue", Problem: p}
	}
	switch {
	case cfg.Prefetch < 0 || cfg.Prefetch > MaxPrefetch:
		return nil, &validate.Error{Kind: ErrInvalidConfig, Field: "Prefetch", Problem: fmt.Sprintf("is %d; use 0 for the default of %d, or 1 to %d", cfg.Prefetch, DefaultPrefetch, MaxPrefetch)}
	case cfg.RequeueDelay < 0:
		return nil, &validate.Error{Kind: ErrInvalidConfig, Field: "RequeueDelay", Problem: "must not be negative"}
	}
	if cfg.DeliveryLimit, err = deliveryLimit(cfg); err != nil {
		return nil, err
	}
	cfg.Prefetch = cmp.Or(cfg.Prefetch, DefaultPrefetch)
	cfg.RequeueDelay = cmp.Or(cfg.RequeueDelay, DefaultRequeueDelay)
	c := &Consumer{cfg: cfg, out: make(chan *Delivery), closing: make(chan struct{}), timers: map[*time.Timer]struct{}{}}
	c.sup = newSupervisor(cfg.ConnConfig, false, c.openSession)
	return c, nil
}

// WaitConnected waits until the consumer is connected and consuming, or
// ctx ends.
func (c *Consumer) WaitConnected(ctx context.Context) error {
	return waitConnected(ctx, c.sup)
}

// Receive returns the next delivery, waiting until one arrives, ctx ends,
// or the consumer is closed (broker.ErrClosed). Deliveries of a channel
// that closed before they were received are skipped: the broker redelivers
// them.
func (c *Consumer) Receive(ctx context.Context) (broker.Delivery, error) {
	for {
		select {
		case <-c.closing:
			return nil, broker.ErrClosed
		default:
		}
		select {
		case <-c.closing:
			return nil, broker.ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("rabbitmq: receive from %s: %w", c.cfg.Queue, ctx.Err())
		case d := <-c.out:
			if !d.sess.isDead() {
				return d, nil
			}
		}
	}
}

// Close stops consuming and closes the connection: the broker redelivers
// every delivery not yet acknowledged or rejected. Close is idempotent and
// may be called concurrently.
func (c *Consumer) Close() error {
	c.once.Do(func() { close(c.closing) })
	c.sup.close()
	c.timersMu.Lock()
	defer c.timersMu.Unlock()
	for t := range c.timers {
		t.Stop()
	}
	clear(c.timers)
	return nil
}

// consSession is one consuming channel.
type consSession struct {
	ch     *amqp.Channel
	deadCh chan struct{}
	once   sync.Once
	// deliveryLimit is the queue's on this connection's broker (see
	// ConsumerConfig.DeliveryLimit); 0 for none.
	deliveryLimit int
}

func (s *consSession) dead() <-chan struct{} { return s.deadCh }

func (s *consSession) kill() { s.once.Do(func() { close(s.deadCh) }) }

func (s *consSession) close(error) {
	s.kill()
	_ = s.ch.Close()
}

func (s *consSession) isDead() bool {
	select {
	case <-s.deadCh:
		return true
	default:
		return false
	}
}

func (c *Consumer) openSession(conn *amqp.Connection) (session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: opening the consuming channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("rabbitmq: setting prefetch: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(c.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: consuming %s: %w", c.cfg.Queue, err)
	}
	s := &consSession{ch: ch, deadCh: make(chan struct{}), deliveryLimit: c.deliveryLimitOn(conn)}
	go func() {
		select {
		case e := <-closed:
			c.cfg.Logger.Debug("llmq: rabbitmq consuming channel closed", "queue", c.cfg.Queue, "err", e)
			s.kill()
		case <-s.deadCh:
		}
	}()
	go func() {
		// Ends when the channel closes or the broker cancels the consumer
		// (its queue was deleted): either way the session must be redone.
		defer s.kill()
		for raw := range deliveries {
			d := &Delivery{raw: raw, sess: s, c: c, msg: toMessage(raw)}
			select {
			case c.out <- d:
			case <-s.deadCh:
			case <-c.closing:
			}
		}
	}()
	return s, nil
}

// toMessage reads a delivery. AMQP has no null body, so Body is never nil.
// Header values are rendered as text by fieldText, and strings and byte
// arrays passed on whatever their bytes: the receiver judges them
// (package inbox quarantines those it refuses).
func toMessage(d amqp.Delivery) broker.Message {
	m := broker.Message{ID: d.MessageId, Topic: d.RoutingKey, Body: d.Body}
	if m.Body == nil {
		m.Body = []byte{}
	}
	if len(d.Headers) > 0 {
		m.Headers = make(map[string]string, len(d.Headers))
	}
	for k, v := range d.Headers {
		s := fieldText(v)
		if k == HeaderKey {
			m.Key = s
			continue
		}
		m.Headers[k] = s
	}
	return m
}

// Delivery is one message received by a Consumer. It must be settled on the
// channel that delivered it; after that channel closed it cannot be, and the
// broker redelivers it.
type Delivery struct {
	raw     amqp.Delivery
	sess    *consSession
	c       *Consumer
	msg     broker.Message
	settled atomic.Bool
}

var _ broker.LimitedDelivery = (*Delivery)(nil)

// Message returns the message; Key comes from the HeaderKey header, which
// Headers then omits.
func (d *Delivery) Message() broker.Message { return d.msg }

// Source names the queue.
func (d *Delivery) Source() broker.Source { return broker.Source{Queue: d.c.cfg.Queue} }

// Redelivered reports whether the broker delivered the message before (to
// this or another consumer) without it being acknowledged.
func (d *Delivery) Redelivered() bool { return d.raw.Redelivered }

// Ack acknowledges the delivery. It is an asynchronous frame on the
// delivering channel: it fails only if that channel is already closed, in
// which case the broker delivers the message again.
func (d *Delivery) Ack(context.Context) error {
	return d.settle("ack", func() error { return d.raw.Ack(false) })
}

// Nack hands the message back after ConsumerConfig.RequeueDelay, measured
// by a timer: Nack returns at once. If the channel closes meanwhile, the
// broker requeues it anyway. On the message's last delivery (see
// DeliveryAttempt) the broker dead-letters it instead, which is logged as
// a warning.
func (d *Delivery) Nack(context.Context) error {
	return d.settle("nack", func() error {
		c := d.c
		if d.lastAttempt() {
			attempt, _ := d.DeliveryAttempt()
			c.cfg.Logger.Warn("llmq: a message nacked on its last delivery: the queue's delivery limit dead-letters it",
				"queue", c.cfg.Queue, "message", d.msg.ID, "delivery", attempt, "delivery_limit", d.sess.deliveryLimit)
		}
		c.timersMu.Lock()
		defer c.timersMu.Unlock()
		select {
		case <-c.closing:
			return broker.ErrClosed
		default:
		}
		var t *time.Timer
		t = time.AfterFunc(c.cfg.RequeueDelay, func() {
			c.timersMu.Lock()
			delete(c.timers, t)
			c.timersMu.Unlock()
			if err := d.raw.Nack(false, true); err != nil {
				c.cfg.Logger.Debug("llmq: delayed requeue failed; the closed channel requeued it", "queue", c.cfg.Queue, "message", d.msg.ID, "err", err)
			}
		})
		c.timers[t] = struct{}{}
		return nil
	})
}

// Reject rejects the delivery without requeueing: the queue dead-letters
// it to its dead-letter exchange (with an x-death header saying
// "rejected"). AMQP carries no reason with a rejection; reason is logged
// at debug level (the receiver reports the rejection; package inbox logs
// it as an error), and the inbox quarantine row is the place that
// explains it.
func (d *Delivery) Reject(_ context.Context, reason error) error {
	return d.settle("reject", func() error {
		d.c.cfg.Logger.Debug("llmq: message rejected to the dead-letter exchange", "queue", d.c.cfg.Queue, "message", d.msg.ID, "reason", reason)
		return d.raw.Reject(false)
	})
}

func (d *Delivery) settle(op string, f func() error) error {
	if !d.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("rabbitmq: %s of message %s: %w", op, d.msg.ID, ErrSettled)
	}
	if d.sess.isDead() {
		return fmt.Errorf("rabbitmq: %s of message %s: its channel closed, the broker redelivers it: %w", op, d.msg.ID, ErrConnectionLost)
	}
	if err := f(); err != nil {
		return fmt.Errorf("rabbitmq: %s of message %s: %w", op, d.msg.ID, err)
	}
	return nil
}
