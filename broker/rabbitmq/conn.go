package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/llmqtype"
)

// DefaultURL is the broker ConnConfig.URL defaults to: a local RabbitMQ
// with its default account.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

var (
	// ErrNotConnected is returned at once by a Publish while the connection
	// is down (being redialled): nothing was sent. The outbox relay retries.
	ErrNotConnected = errors.New("rabbitmq: not connected")
	// ErrConnectionLost fails messages sent on a connection or channel that
	// closed before the broker confirmed them. They may or may not have
	// arrived; republishing is safe because receivers deduplicate by id.
	ErrConnectionLost = errors.New("rabbitmq: connection lost before the broker confirmed")
	// ErrBlocked is returned at once by a Publish while the broker blocks
	// the connection (a memory or disk alarm): nothing was sent.
	ErrBlocked = errors.New("rabbitmq: broker blocked publishing")
	// ErrInvalidConfig is matched by every configuration error of this
	// package.
	ErrInvalidConfig = errors.New("rabbitmq: invalid configuration")
)

// ConnConfig says how a Publisher or Consumer reaches the broker. Zero
// values mean the documented defaults.
type ConnConfig struct {
	// URL of the broker. Default DefaultURL.
	URL string
	// Name is the client-provided connection name the broker shows (and
	// rabbitmqctl close_connection can find). Default "llmq".
	Name string
	// DialTimeout bounds each dial and handshake. Default 5s.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat: a dead peer is noticed within about
	// two of them. Default 10s.
	Heartbeat time.Duration
	// Reconnect is the full-jitter backoff between redials. Default base
	// 100ms, cap 5s.
	Reconnect llmqtype.BackoffPolicy
	// Topology is declared on every (re)connection, before the connection
	// is used. Optional.
	Topology *Topology
	// Logger receives connection losses and redials (warnings). Default
	// slog.Default(), so that they are seen without configuration.
	Logger *slog.Logger
}

func (c ConnConfig) withDefaults() (ConnConfig, error) {
	c.URL = cmp.Or(c.URL, DefaultURL)
	if _, err := amqp.ParseURI(c.URL); err != nil {
		return c, fmt.Errorf("%w: URL: %w", ErrInvalidConfig, err)
	}
	if c.DialTimeout < 0 || c.Heartbeat < 0 {
		return c, fmt.Errorf("%w: DialTimeout and Heartbeat must not be negative", ErrInvalidConfig)
	}
	c.Name = cmp.Or(c.Name, "llmq")
	c.DialTimeout = cmp.Or(c.DialTimeout, 5*time.Second)
	c.Heartbeat = cmp.Or(c.Heartbeat, 10*time.Second)
	c.Reconnect = llmqtype.BackoffPolicy{Base: cmp.Or(c.Reconnect.Base, 100*time.Millisecond), Cap: cmp.Or(c.Reconnect.Cap, 5*time.Second)}
	if err := c.Reconnect.Validate(); err != nil {
		return c, fmt.Errorf("%w: Reconnect: %w", ErrInvalidConfig, err)
	}
	if c.Topology != nil {
		if err := c.Topology.Validate(); err != nil {
			return c, err
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// dial opens one connection. The library's own recovery stays off: this
// package redials itself, so that every message in flight on a dead
// connection is failed (not silently re-sequenced) and a Publish while down
// fails fast.
func (c ConnConfig) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.Name)
	return amqp.DialConfig(c.URL, amqp.Config{
		Heartbeat:  c.Heartbeat,
		Properties: props,
		Dial:       amqp.DefaultDial(c.DialTimeout),
	})
}

// session is what a supervisor keeps open on one connection: a publisher's
// or a consumer's channels. dead is closed when the session cannot go on
// (its channel closed); close tears it down.
type session interface {
	dead() <-chan struct{}
	close(cause error)
}

// supervisor keeps one connection and its session open: it dials, sets the
// session up (channels, topology, confirms, QoS), watches the connection's
// close and blocked notifications, and redials with backoff when either the
// connection or the session dies.
type supervisor struct {
	cfg   ConnConfig
	setup func(*amqp.Connection) (session, error)
	// publishes says a blocked connection is unusable: the broker blocks
	// only connections that publish, and a consumer's goes on acking.
	publishes bool

	mu      sync.Mutex
	cur     session // nil while disconnected
	blocked string  // the broker's reason while it blocks the connection
	lastErr error   // why the last connection or dial failed
	changed chan struct{}

	stop     chan struct{}
	stopOnce sync.Once // close may be called concurrently
	done     chan struct{}
}

func newSupervisor(cfg ConnConfig, publishes bool, setup func(*amqp.Connection) (session, error)) *supervisor {
	s := &supervisor{
		cfg: cfg, setup: setup, publishes: publishes,
		lastErr: errors.New("not connected yet"),
		changed: make(chan struct{}),
		stop:    make(chan struct{}), done: make(chan struct{}),
	}
	go s.run()
	return s
}

// current returns the open session, or why there is none.
func (s *supervisor) current() (session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cur == nil:
		return nil, fmt.Errorf("%w: %w", ErrNotConnected, s.lastErr)
	case s.blocked != "" && s.publishes:
		return nil, fmt.Errorf("%w: %s", ErrBlocked, s.blocked)
	}
	return s.cur, nil
}

// watch returns a channel closed at the next change of connection state.
func (s *supervisor) watch() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *supervisor) set(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// close stops the supervisor and closes its connection. It is idempotent
// and safe for concurrent use: every call returns once the supervisor has
// stopped.
func (s *supervisor) close() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

func (s *supervisor) run() {
	defer close(s.done)
	for attempt := 0; ; {
		err := s.connectOnce()
		if err == nil {
			attempt = 0
		} else {
			attempt++
		}
		select {
		case <-s.stop:
			return
		default:
		}
		if err != nil {
			delay := s.cfg.Reconnect.Delay(attempt, nil)
			s.cfg.Logger.Warn("llmq: rabbitmq connection failed; redialling", "name", s.cfg.Name, "err", err, "attempt", attempt, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// closeConn closes conn, waiting for the broker's answer at most
// DialTimeout.
func (s *supervisor) closeConn(conn *amqp.Connection) {
	_ = conn.CloseDeadline(time.Now().Add(s.cfg.DialTimeout))
}

// connectOnce dials, sets up a session and serves it until the connection
// or session dies or the supervisor stops. It returns nil after a clean
// stop or a connection that worked for a while (redial at once).
func (s *supervisor) connectOnce() error {
	conn, err := s.cfg.dial()
	if err != nil {
		s.set(func() { s.lastErr = err })
		return err
	}
	// Both notification channels are buffered and drained until the
	// library closes them: a full one would stall its reader goroutine.
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	defer func() {
		go func() {
			for range blocked { // drained until the library closes it
			}
		}()
	}()
	if s.cfg.Topology != nil {
		if err := s.cfg.Topology.declareOn(conn); err != nil {
			s.closeConn(conn)
			s.set(func() { s.lastErr = err })
			return err
		}
	}
	sess, err := s.setup(conn)
	if err != nil {
		s.closeConn(conn)
		s.set(func() { s.lastErr = err })
		return err
	}
	s.set(func() { s.cur, s.blocked = sess, "" })
	started := time.Now()
	var cause error
	for cause == nil {
		select {
		case <-s.stop:
			cause = errors.New("closed")
		case e, ok := <-closed:
			if !ok || e == nil {
				cause = errors.New("connection closed")
			} else {
				cause = e
			}
		case <-sess.dead():
			cause = errors.New("channel closed")
		case b, ok := <-blocked:
			if !ok {
				cause = errors.New("connection closed")
				break
			}
			reason := ""
			if b.Active {
				reason = cmp.Or(b.Reason, "no reason given")
				s.cfg.Logger.Warn("llmq: rabbitmq blocked the connection", "name", s.cfg.Name, "reason", reason)
			}
			s.set(func() { s.blocked = reason })
		}
	}
	s.set(func() { s.cur, s.blocked, s.lastErr = nil, "", cause })
	// The connection first, within a deadline: closing its channels then
	// cannot wait on a peer that stopped answering.
	s.closeConn(conn)
	sess.close(fmt.Errorf("%w: %w", ErrConnectionLost, cause))
	select {
	case <-s.stop:
		return nil
	default:
	}
	s.cfg.Logger.Warn("llmq: rabbitmq connection lost; redialling", "name", s.cfg.Name, "err", cause)
	if time.Since(started) < time.Second {
		return cause // flapping: back off
	}
	return nil
}
