package inbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTransient marks a handler error that is not the message's fault,
// such as a service the handler calls being down: the delivery is nacked
// and redelivered however often it happens, and the failure does not count
// toward IngressConfig.MaxAttempts. Wrap a handler's error with Transient
// to say so.
var ErrTransient = errors.New("inbox: transient failure")

// Transient marks err as a transient failure.
func Transient(err error) error { return fmt.Errorf("%w: %w", ErrTransient, err) }

// ErrTooManyAttempts is the reason of a message quarantined and rejected
// because its handling failed IngressConfig.MaxAttempts times.
var ErrTooManyAttempts = errors.New("inbox: message failed too many times")

// errHandlerPanicked reports a handler that panicked; it counts as a
// failure of the message.
var errHandlerPanicked = errors.New("inbox: the handler panicked")

// permanent reports whether err means the message can never be accepted,
// however often it is delivered: ErrMalformed, or a *ValidationError
// (llmq's typed bad-input error, such as one for a message the inbox
// refuses or a job built from a bad payload).
func permanent(err error) bool {
	var invalid *ValidationError
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
	return c.n
}

// forget drops id's count: its message was settled for good.
func (f *failureCounts) forget(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.byID, id)
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
