package inbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/llmqtype"
)

// ErrTransient marks a handler error that is not the message's fault,
// such as a service the handler calls being down: the delivery is nacked
// and redelivered however often it happens (up to the last delivery of a
// broker with a delivery limit: see ErrDeliveryLimit), and the failure
// does not count toward IngressConfig.MaxAttempts. Wrap a handler's error
// with Transient to say so.
var ErrTransient = errors.New("inbox: transient failure")

// Transient marks err as a transient failure.
func Transient(err error) error { return fmt.Errorf("%w: %w", ErrTransient, err) }

// ErrTooManyAttempts is the reason of a message quarantined and rejected
// because its handling failed IngressConfig.MaxAttempts times.
var ErrTooManyAttempts = errors.New("inbox: message failed too many times")

// errHandlerPanicked reports a handler that panicked; it counts as a
// failure of the message.
var errHandlerPanicked = errors.New("inbox: the handler panicked")

// errHandlerBrokeSavepoint reports a handler after which its savepoint
// could be neither released nor rolled back, the database refusing: most
// often a statement of the handler failed, aborting the transaction, and
// the handler ignored the error and returned nil (or it ended the
// savepoint or the transaction itself). It is a handler bug and counts as
// a failure of the message.
var errHandlerBrokeSavepoint = errors.New("inbox: the handler left its savepoint unusable (did it ignore a failed statement's error?)")

// permanent reports whether err means the message can never be accepted,
// however often it is delivered: ErrMalformed, or a *llmqtype.ValidationError
// (llmq's typed bad-input error, such as one for a message the inbox
// refuses or a job built from a bad payload).
func permanent(err error) bool {
	var invalid *llmqtype.ValidationError
	return errors.Is(err, ErrMalformed) || errors.As(err, &invalid)
}

// transient reports whether err is known to say nothing about the message:
// ErrTransient, or the database unreachable, restarting, out of resources,
// or aborting the transaction for a conflict (serialization failure,
// deadlock, lock timeout), or a network peer unreachable. A redelivery
// may succeed.
func transient(err error) bool {
	if errors.Is(err, ErrTransient) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if dberr.Connection(err) {
			// The session's trouble, not the message's: among others, a
			// statement of pgx's cache that a pooler in transaction mode
			// lost, or a cached plan whose table a migration changed.
			return true
		}
		switch pgErr.Code {
		case "57014": // query_canceled: a statement timeout may be the message's doing
			return false
		case "55P03": // lock_not_available
			return true
		}
		switch pgErr.Code[:min(len(pgErr.Code), 2)] {
		case "08", // connection exception
			"40", // transaction rollback: serialization failure, deadlock
			"53", // insufficient resources: too many connections, disk full
			"57", // operator intervention: shutdown, cannot connect now
			"58": // system error
			return true
		}
		return false
	}
	// A peer that cannot be reached or dropped the connection. Timeouts are
	// not here: a message can make its own handling slow.
	var (
		connectErr *pgconn.ConnectError
		opErr      *net.OpError
		dnsErr     *net.DNSError
	)
	return errors.As(err, &connectErr) || errors.As(err, &opErr) || errors.As(err, &dnsErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}

// maxTrackedFailures bounds the ids failureCounts remembers.
const maxTrackedFailures = 10_000

// failureCounts counts, by message id, how often the handling of messages
// still being retried failed, for IngressConfig.MaxAttempts. A message is
// forgotten once it is acknowledged or rejected. At most
// maxTrackedFailures ids are kept: past that the one whose last failure is
// oldest is forgotten, which only gives it more attempts.
type failureCounts struct {
	size atomic.Int64 // len(byID), read without the lock
	mu   sync.Mutex
	seq  uint64
	byID map[string]failureCount
}

type failureCount struct {
	n   int
	seq uint64 // when it last failed, in add calls
}

func newFailureCounts() *failureCounts {
	return &failureCounts{byID: map[string]failureCount{}}
}

// add counts a failure of id and returns how many it has had.
func (f *failureCounts) add(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	c, ok := f.byID[id]
	if !ok && len(f.byID) >= maxTrackedFailures {
		f.evictOldestLocked()
	}
	c.n++
	c.seq = f.seq
	f.byID[id] = c
	f.size.Store(int64(len(f.byID)))
	return c.n
}

// count returns how many failures of id were counted.
func (f *failureCounts) count(id string) int {
	if f.size.Load() == 0 {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byID[id].n
}

// forget drops id's count: its message was settled for good. Nearly every
// message has none, and then no lock is taken.
func (f *failureCounts) forget(id string) {
	if f.size.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.byID, id)
	f.size.Store(int64(len(f.byID)))
}

func (f *failureCounts) evictOldestLocked() {
	var (
		oldest string
		seq    uint64
		found  bool
	)
	for id, c := range f.byID {
		if !found || c.seq < seq {
			oldest, seq, found = id, c.seq, true
		}
	}
	delete(f.byID, oldest)
}

// maxUnrejected bounds the deliveries unrejectedSet remembers.
const maxUnrejected = 10_000

// unrejectedSet remembers deliveries that were quarantined but whose
// Reject failed (a dead-letter produce that failed, a closed channel), so
// that their redelivery is rejected again without a second quarantine
// row. A delivery is known by its Kafka record (topic, partition, offset)
// or else by its queue and message id; one without either (a RabbitMQ
// message without message-id) is quarantined again. At most maxUnrejected
// are kept: past that an arbitrary one is forgotten and, if it comes back,
// quarantined again.
type unrejectedSet struct {
	size  atomic.Int64 // len(byKey), read without the lock
	mu    sync.Mutex
	byKey map[string]error // the reason it was quarantined for
}

func newUnrejectedSet() *unrejectedSet { return &unrejectedSet{byKey: map[string]error{}} }

func deliveryKey(d broker.Delivery) (string, bool) {
	src := d.Source()
	switch id := d.Message().ID; {
	case src.Topic != "":
		return fmt.Sprintf("record %q %d %d", src.Topic, src.Partition, src.Offset), true
	case id != "":
		return fmt.Sprintf("message %q %q", src.Queue, id), true
	}
	return "", false
}

// settled records how the Reject of a quarantined delivery ended.
func (u *unrejectedSet) settled(d broker.Delivery, cause error, rejected bool) {
	if rejected && u.size.Load() == 0 {
		return
	}
	key, ok := deliveryKey(d)
	if !ok {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	defer func() { u.size.Store(int64(len(u.byKey))) }()
	if rejected {
		delete(u.byKey, key)
		return
	}
	if len(u.byKey) >= maxUnrejected {
		for k := range u.byKey {
			delete(u.byKey, k)
			break
		}
	}
	u.byKey[key] = cause
}

// cause returns why d was quarantined, if it was and its Reject failed.
// While there is none, which is nearly always, it costs an atomic load.
func (u *unrejectedSet) cause(d broker.Delivery) error {
	if u.size.Load() == 0 {
		return nil
	}
	key, ok := deliveryKey(d)
	if !ok {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.byKey[key]
}

// alreadyQuarantinedError is the problem of a delivery quarantined before whose
// Reject failed: it is rejected again, without a second quarantine row.
type alreadyQuarantinedError struct{ cause error }

func (a alreadyQuarantinedError) Error() string { return a.cause.Error() }

func (a alreadyQuarantinedError) Unwrap() error { return a.cause }
