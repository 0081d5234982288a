package admission

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

// Limits on identifiers.
const (
	MaxPoolLen   = 200
	MaxTenantLen = 200
)

var (
	// ErrInvalid is matched (errors.Is) by every *llmqtype.ValidationError of this
	// package: the input was refused before anything was written.
	ErrInvalid = errors.New("admission: invalid input")
	// ErrWait is matched by a *WaitError: the pool cannot grant now; try
	// again after its RetryAfter.
	ErrWait = errors.New("admission: pool busy")
	// ErrNeverAdmissible is matched by a *NeverAdmissibleError: the request
	// reserves more tokens than the pool's token burst, so no amount of
	// waiting would admit it.
	ErrNeverAdmissible = errors.New("admission: request can never be admitted")
	// ErrUnknownPool is returned for a pool that was never configured.
	ErrUnknownPool = errors.New("admission: unknown pool")
	// ErrUnavailable is returned when the shared limiter cannot be reached
	// and its failure policy admits nothing (fail closed, or the emergency
	// allowance is spent or expired).
	ErrUnavailable = errors.New("admission: limiter unavailable")
	// ErrReleased is returned by a second Release of the same permit.
	ErrReleased = errors.New("admission: permit already released")
)

func invalid(field, problem string) error {
	return &llmqtype.ValidationError{Kind: ErrInvalid, Field: field, Problem: problem}
}

// Reason says which dimension denied an acquire.
type Reason string

// The dimensions that can deny an acquire.
const (
	ReasonCooldown Reason = "cooldown"
	ReasonInFlight Reason = "in_flight"
	ReasonRequests Reason = "requests"
	ReasonTokens   Reason = "tokens"
	// ReasonInFlightTokens: the pool's in-flight token budget
	// (Pool.MaxInFlightTokens) cannot hold the request until calls in
	// flight are released.
	ReasonInFlightTokens Reason = "in_flight_tokens"
	// ReasonContention: the pool could grant when it was read after the
	// denial; others took what was free in between. Retry almost at once.
	ReasonContention Reason = "contention"
)

// contentionRetry is the pause after a denial that the pool's state no
// longer explains: short, so the caller competes again at once, but not
// zero, so a crowd of callers does not spin on the database.
const contentionRetry = 5 * time.Millisecond

// WaitError reports a denied acquire and how long to wait before the next
// try is expected to succeed (a lower bound when the reason is in-flight,
// since a slot frees only when someone releases).
type WaitError struct {
	Pool       string
	Reason     Reason
	RetryAfter time.Duration
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("%v: pool %q denied by %s; retry after %v", ErrWait, e.Pool, e.Reason, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrWait) true.
func (e *WaitError) Unwrap() error { return ErrWait }

// NeverAdmissibleError reports a request larger than its pool's token
// burst, or than its in-flight token budget.
type NeverAdmissibleError struct {
	Pool       string
	Tokens     int64
	TokenBurst int64
	// MaxInFlightTokens is the pool's in-flight token budget when that is
	// what the request exceeds; 0 when it is the token burst.
	MaxInFlightTokens int64
}

func (e *NeverAdmissibleError) Error() string {
	if e.MaxInFlightTokens > 0 {
		return fmt.Sprintf("%v: pool %q: %d tokens requested, the in-flight token budget is %d", ErrNeverAdmissible, e.Pool, e.Tokens, e.MaxInFlightTokens)
	}
	return fmt.Sprintf("%v: pool %q: %d tokens requested, the token burst is %d", ErrNeverAdmissible, e.Pool, e.Tokens, e.TokenBurst)
}

// neverAdmissible reports req as never admissible by pool p, or nil.
func neverAdmissible(p Pool, req Request) error {
	switch {
	case req.Tokens > p.TokenBurst:
		return &NeverAdmissibleError{Pool: p.Name, Tokens: req.Tokens, TokenBurst: p.TokenBurst}
	case p.MaxInFlightTokens > 0 && req.Tokens > p.MaxInFlightTokens:
		return &NeverAdmissibleError{Pool: p.Name, Tokens: req.Tokens, TokenBurst: p.TokenBurst, MaxInFlightTokens: p.MaxInFlightTokens}
	}
	return nil
}

// Unwrap makes errors.Is(err, ErrNeverAdmissible) true.
func (e *NeverAdmissibleError) Unwrap() error { return ErrNeverAdmissible }

// WaitDuration reports how long err asks the caller to wait: a *WaitError's
// RetryAfter, or false for any other error.
func WaitDuration(err error) (time.Duration, bool) {
	var w *WaitError
	if errors.As(err, &w) {
		return w.RetryAfter, true
	}
	return 0, false
}

// Request is what one provider call needs: one request-budget unit, Tokens
// reserved from the token budget (prompt plus max output, as the provider
// counts them), and one in-flight slot, all from Pool.
type Request struct {
	// Pool is the scope that shares a provider quota (a provider project
	// or model deployment). Required.
	Pool string
	// Tenant is recorded with the permit, for usage and inspection.
	Tenant string
	// Tokens to reserve; must not be negative.
	Tokens int64
}

// Validate reports a request that cannot be served.
func (r Request) Validate() error {
	if p := validate.Text(r.Pool, true, MaxPoolLen); p != "" {
		return invalid("Pool", p)
	}
	if p := validate.Text(r.Tenant, false, MaxTenantLen); p != "" {
		return invalid("Tenant", p)
	}
	if r.Tokens < 0 {
		return invalid("Tokens", fmt.Sprintf("is %d; must not be negative", r.Tokens))
	}
	return nil
}

// CallResult says how far a call got, which decides what Release refunds.
type CallResult int8

const (
	// CallNotSent means the call never left this process. Everything is refunded.
	CallNotSent CallResult = iota
	// CallAnswered means the provider answered (any status that proves it counted
	// the call, with usage). The request is spent; unused tokens are
	// refunded unless the pool charges the reservation.
	CallAnswered
	// CallUncertain means the call was sent and may have been counted: a timeout,
	// a 5xx, a 429, a connection lost after sending. The request is spent;
	// tokens are refunded only if the pool says so. Mark the attempt
	// uncertain.
	CallUncertain
)

// String names the result.
func (r CallResult) String() string {
	switch r {
	case CallNotSent:
		return "not_sent"
	case CallAnswered:
		return "answered"
	case CallUncertain:
		return "uncertain"
	}
	return fmt.Sprintf("CallResult(%d)", r)
}

// CallOutcome is what Release reconciles: how far the call got and the tokens
// the provider reported for it.
type CallOutcome struct {
	Result       CallResult
	InputTokens  int64
	OutputTokens int64
}

func (o CallOutcome) validate() error {
	switch {
	case o.Result < CallNotSent || o.Result > CallUncertain:
		return invalid("Result", fmt.Sprintf("is %d; use CallNotSent, CallAnswered or CallUncertain", o.Result))
	case o.InputTokens < 0 || o.OutputTokens < 0:
		return invalid("InputTokens/OutputTokens", "must not be negative")
	case o.Result == CallNotSent && o.InputTokens+o.OutputTokens != 0:
		return invalid("Result", "a call that was not sent used no tokens")
	}
	return nil
}

// used is the token count the provider charged.
func (o CallOutcome) used() int64 { return o.InputTokens + o.OutputTokens }

// Limiter admits provider calls. Acquire either grants every dimension of
// the request at once and returns a Permit, or takes nothing and returns a
// *WaitError (errors.Is ErrWait), a *NeverAdmissibleError, ErrUnknownPool,
// a *llmqtype.ValidationError or ErrUnavailable.
//
// Cooldown and LowerRemaining carry what a provider said back to every
// holder of the pool: a cooldown only extends, and remaining budgets only
// lower what the limiter would grant.
//
// Ready reports whether a request of tokens could be granted now, taking
// nothing: nil, or the error Acquire would return (a *WaitError says how
// long and why). A runner asks before it claims work for the pool.
type Limiter interface {
	Acquire(ctx context.Context, req Request) (*Permit, error)
	Ready(ctx context.Context, pool string, tokens int64) error
	Cooldown(ctx context.Context, pool string, d time.Duration) error
	LowerRemaining(ctx context.Context, pool string, r Remaining) error
}

// Remaining is a provider's report of the budget left in the current
// window; a nil field was not reported.
type Remaining struct {
	Requests *int64
	Tokens   *int64
}

// releaseFunc settles a permit with its limiter.
type releaseFunc func(ctx context.Context, p *Permit, o CallOutcome) error

// Permit is a granted request. Release it exactly once, with how the call
// went; a permit that is never released expires on its own (Postgres) or
// holds its slot until the process ends (local).
type Permit struct {
	ID     uuid.UUID
	Pool   string
	Tenant string
	Tokens int64
	// Acquired is the grant's time on the limiter's bucket clock (for
	// Postgres the database's, never earlier than the pool's previous
	// grant): every window of w holds at most RPM/60·w + RequestBurst
	// grants by this clock.
	Acquired time.Time
	Expires  time.Time // zero for a local permit
	release  releaseFunc
	released atomic.Bool
}

// Release settles the permit: it frees the in-flight slot and refunds by
// o and the pool's policy (see CallResult). A second Release returns
// ErrReleased and changes nothing. With the Postgres limiter, a release
// whose cycle fails (contention, a lost connection, an outage) is tried
// again, also after ctx ends; an error from Release then says it failed
// for good, or that ctx ended first, and the permit may expire instead.
func (p *Permit) Release(ctx context.Context, o CallOutcome) error {
	if err := o.validate(); err != nil {
		return err
	}
	if !p.released.CompareAndSwap(false, true) {
		return ErrReleased
	}
	return p.release(ctx, p, o)
}
