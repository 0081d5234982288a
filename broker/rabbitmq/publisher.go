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

// HeaderKey carries Message.Key: AMQP has no message key, and a
// consistent-hash exchange can hash on this header (hash-header).
const HeaderKey = "llmq-key"

var (
	// ErrUnroutable fails a message the broker returned (mandatory
	// publishing): no queue is bound for its routing key. It was not
	// stored anywhere, even though the broker confirmed it.
	ErrUnroutable = errors.New("rabbitmq: message unroutable")
	// ErrNacked fails a message the broker refused (basic.nack): a queue
	// at its length limit with reject-publish, or an internal error.
	ErrNacked = errors.New("rabbitmq: message refused by the broker")
	// ErrInvalidMessage fails a message that cannot be sent as it is.
	ErrInvalidMessage = errors.New("rabbitmq: invalid message")
)

// Publisher defaults and limits.
const (
	DefaultWindow         = 512
	MaxWindow             = 1 << 16
	DefaultPublishTimeout = 30 * time.Second
)

// PublisherConfig configures a Publisher. Zero values mean the documented
// defaults.
type PublisherConfig struct {
	ConnConfig
	// Exchange receives the messages, with Message.Topic as routing key.
	// Empty means the default exchange (the topic names a queue).
	Exchange string
	// Window bounds the messages sent and not yet confirmed, across all
	// concurrent Publish calls. Default 512, at most 65536.
	Window int
	// PublishTimeout bounds a Publish whose context has no deadline.
	// Default 30s.
	PublishTimeout time.Duration
}

// Publisher is a broker.Publisher on one connection and one channel in
// confirm mode, redialled when lost. Safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	sup    *supervisor
	window chan struct{}
	closed atomic.Bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg and starts connecting in the background;
// Publish fails with ErrNotConnected until the first connection is up (see
// WaitConnected).
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	conn, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig = conn
	switch {
	case cfg.Window < 0 || cfg.Window > MaxWindow:
		return nil, &validate.Error{Kind: ErrInvalidConfig, Field: "Window", Problem: fmt.Sprintf("is %d; use 0 for the default of %d, or 1 to %d", cfg.Window, DefaultWindow, MaxWindow)}
	case cfg.PublishTimeout < 0:
		return nil, &validate.Error{Kind: ErrInvalidConfig, Field: "PublishTimeout", Problem: "must not be negative"}
	}
	if p := validate.Text(cfg.Exchange, false, maxNameLen); p != "" {
		return nil, &validate.Error{Kind: ErrInvalidConfig, Field: "Exchange", Problem: p}
	}
	cfg.Window = cmp.Or(cfg.Window, DefaultWindow)
	cfg.PublishTimeout = cmp.Or(cfg.PublishTimeout, DefaultPublishTimeout)
	p := &Publisher{cfg: cfg, window: make(chan struct{}, cfg.Window)}
	p.sup = newSupervisor(cfg.ConnConfig, true, p.openSession)
	return p, nil
}

// WaitConnected waits until the publisher is connected, or ctx ends.
func (p *Publisher) WaitConnected(ctx context.Context) error {
	return waitConnected(ctx, p.sup)
}

func waitConnected(ctx context.Context, sup *supervisor) error {
	for {
		changed := sup.watch()
		_, err := sup.current()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		case <-changed:
		}
	}
}

// Close closes the connection. Messages not yet confirmed fail; Publish
// then returns broker.ErrClosed. Close is idempotent and may be called
// concurrently.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	p.sup.close()
	return nil
}

// Publish sends msgs to the exchange, mandatory and persistent, with
// MessageId = Message.ID, and waits for every confirm within ctx (or
// PublishTimeout). A message the broker returned as unroutable, nacked, or
// did not confirm before the connection dropped or ctx ended is reported in
// a *broker.PublishError; the others were confirmed. While disconnected it
// fails at once with ErrNotConnected (or ErrBlocked), sending nothing.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if p.closed.Load() {
		return broker.ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rabbitmq: publish: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.PublishTimeout)
		defer cancel()
	}
	s, err := p.sup.current()
	if err != nil {
		return err
	}
	sess, ok := s.(*pubSession)
	if !ok {
		return fmt.Errorf("rabbitmq: unexpected session %T", s)
	}
	call := newPublishCall(len(msgs))
sending:
	for i, m := range msgs {
		pub, err := toPublishing(m)
		if err != nil {
			call.settle(i, err)
			continue
		}
		select {
		case p.window <- struct{}{}:
		case <-ctx.Done():
			call.failFrom(i, ctx.Err())
			break sending
		case <-sess.deadCh:
			call.failFrom(i, sess.err())
			break sending
		}
		sess.send(call, i, m.Topic, pub)
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		call.failFrom(0, fmt.Errorf("waiting for the broker's confirm: %w", ctx.Err()))
	}
	return call.result()
}

func toPublishing(m broker.Message) (amqp.Publishing, error) {
	fail := func(field, problem string) error {
		return &validate.Error{Kind: ErrInvalidMessage, Field: field, Problem: problem}
	}
	if p := validate.Text(m.ID, true, maxNameLen); p != "" {
		return amqp.Publishing{}, fail("Message.ID", p)
	}
	if p := validate.Text(m.Topic, true, maxNameLen); p != "" {
		return amqp.Publishing{}, fail("Message.Topic", p)
	}
	headers := make(amqp.Table, len(m.Headers)+1)
	for k, v := range m.Headers {
		if p := validate.Text(k, true, maxNameLen); p != "" {
			return amqp.Publishing{}, fail("Message.Headers key", p)
		}
		if k == HeaderKey {
			return amqp.Publishing{}, fail("Message.Headers", "must not use "+HeaderKey+", which carries Message.Key")
		}
		headers[k] = v
	}
	if m.Key != "" {
		headers[HeaderKey] = m.Key
	}
	return amqp.Publishing{
		Headers:      headers,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    time.Now(),
		Body:         m.Body,
	}, nil
}

// publishCall collects the verdicts of one Publish call's messages.
type publishCall struct {
	mu        sync.Mutex
	remaining int
	failed    map[int]error
	settled   []bool
	done      chan struct{}
}

func newPublishCall(n int) *publishCall {
	return &publishCall{remaining: n, settled: make([]bool, n), done: make(chan struct{})}
}

// settle records message i's verdict, once; later verdicts (a confirm
// arriving after the call gave up on it) are ignored.
func (c *publishCall) settle(i int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settleLocked(i, err)
}

func (c *publishCall) settleLocked(i int, err error) {
	if c.settled[i] {
		return
	}
	c.settled[i] = true
	if err != nil {
		if c.failed == nil {
			c.failed = map[int]error{}
		}
		c.failed[i] = err
	}
	c.remaining--
	if c.remaining == 0 {
		close(c.done)
	}
}

// failFrom fails every unsettled message from index i on.
func (c *publishCall) failFrom(i int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j := i; j < len(c.settled); j++ {
		c.settleLocked(j, err)
	}
}

func (c *publishCall) result() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failed) == 0 {
		return nil
	}
	return &broker.PublishError{Failed: c.failed}
}

// inflight is one sent, unconfirmed message.
type inflight struct {
	call *publishCall
	idx  int
	id   string
}

// pubSession is a channel in confirm mode. One goroutine (settle) reads
// its confirms and returns, in the order the library's reader delivered
// them.
type pubSession struct {
	ch       *amqp.Channel
	exchange string
	window   chan struct{}
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	chClosed chan *amqp.Error

	sendMu sync.Mutex // keeps a message's sequence number and its send together

	mu       sync.Mutex
	pending  map[uint64]inflight
	returned map[string][]string // message id -> reasons, awaiting their confirm
	cause    error
	deadCh   chan struct{}
}

func (p *Publisher) openSession(conn *amqp.Connection) (session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: opening the publishing channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("rabbitmq: enabling publisher confirms: %w", err)
	}
	s := &pubSession{
		ch: ch, exchange: p.cfg.Exchange, window: p.window,
		// The library's reader abandons a notification its listener does not
		// take within 5s; these buffers hold a whole window, and settle
		// drains them continuously.
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, cap(p.window))),
		returns:  ch.NotifyReturn(make(chan amqp.Return, cap(p.window))),
		chClosed: ch.NotifyClose(make(chan *amqp.Error, 1)),
		pending:  map[uint64]inflight{},
		returned: map[string][]string{},
		deadCh:   make(chan struct{}),
	}
	go s.settleLoop()
	return s, nil
}

func (s *pubSession) dead() <-chan struct{} { return s.deadCh }

func (s *pubSession) close(cause error) {
	s.mu.Lock()
	if s.cause == nil {
		s.cause = cause
	}
	s.mu.Unlock()
	_ = s.ch.Close()
}

func (s *pubSession) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cmp.Or(s.cause, ErrConnectionLost)
}

// send publishes one message holding a window slot, which settle (or a
// failed send) releases.
func (s *pubSession) send(call *publishCall, i int, topic string, pub amqp.Publishing) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	tag := s.ch.GetNextPublishSeqNo()
	s.mu.Lock()
	if s.cause != nil {
		s.mu.Unlock()
		<-s.window
		call.settle(i, s.cause)
		return
	}
	s.pending[tag] = inflight{call: call, idx: i, id: pub.MessageId}
	s.mu.Unlock()
	// The write is not context-aware; it blocks only while the socket does
	// (the heartbeat bounds a dead peer).
	if err := s.ch.Publish(s.exchange, topic, true, false, pub); err != nil {
		s.mu.Lock()
		_, ours := s.pending[tag]
		delete(s.pending, tag)
		s.mu.Unlock()
		if ours {
			<-s.window
			call.settle(i, fmt.Errorf("%w: %w", ErrConnectionLost, err))
		}
	}
}

// settleLoop matches each confirm with its message. RabbitMQ sends a
// mandatory message's basic.return before its basic.ack, and the library
// hands both over from one reader goroutine in that order, so every return
// of a confirmed message is already in s.returns when its confirm is read.
func (s *pubSession) settleLoop() {
	returns := s.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.noteReturn(r)
		case c, ok := <-s.confirms:
			if !ok {
				s.failPending()
				return
			}
			s.drainReturns(returns)
			s.confirm(c)
		}
	}
}

func (s *pubSession) drainReturns(returns chan amqp.Return) {
	for returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			s.noteReturn(r)
		default:
			return
		}
	}
}

func (s *pubSession) noteReturn(r amqp.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	reason := fmt.Sprintf("%d %s: exchange %q, routing key %q", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
	s.returned[r.MessageId] = append(s.returned[r.MessageId], reason)
}

func (s *pubSession) confirm(c amqp.Confirmation) {
	s.mu.Lock()
	m, ok := s.pending[c.DeliveryTag]
	delete(s.pending, c.DeliveryTag)
	var err error
	if reasons := s.returned[m.id]; ok && len(reasons) > 0 {
		err = fmt.Errorf("%w: %s", ErrUnroutable, reasons[0])
		if len(reasons) == 1 {
			delete(s.returned, m.id)
		} else {
			s.returned[m.id] = reasons[1:]
		}
	} else if !c.Ack {
		err = ErrNacked
	}
	s.mu.Unlock()
	if ok {
		<-s.window
		m.call.settle(m.idx, err)
	}
}

// failPending fails what the closed channel never confirmed.
func (s *pubSession) failPending() {
	cause := ErrConnectionLost
	select {
	case e, ok := <-s.chClosed:
		if ok && e != nil {
			cause = fmt.Errorf("%w: %w", ErrConnectionLost, e)
		}
	default:
	}
	s.mu.Lock()
	if s.cause == nil {
		s.cause = cause
	}
	pending := s.pending
	s.pending = map[uint64]inflight{}
	cause = s.cause
	s.mu.Unlock()
	for _, m := range pending {
		<-s.window
		m.call.settle(m.idx, cause)
	}
	close(s.deadCh)
}
