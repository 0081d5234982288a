package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"
)

// Local is a single-process limiter with the same contract as Postgres:
// golang.org/x/time/rate token buckets for requests and tokens plus
// counting semaphores for in-flight calls and their tokens, all taken
// together under one mutex. Its ceilings hold only within this process; use it for a single
// replica, in tests, and (inside Postgres) as the emergency allowance.
//
// rate.Limiter has no partial refund; Release returns tokens by reserving a
// negative count, which rate.Limiter adds to its bucket and caps at the
// burst on its next use (TestRefunds pins this down for both limiters).
type Local struct {
	mu            sync.Mutex
	pools         map[string]*localPool
	inFlightRetry time.Duration
	now           func() time.Time
}

type localPool struct {
	cfg      Pool
	requests *rate.Limiter
	tokens   *rate.Limiter
	inFlight int
	// inFlightTokens is what the permits out reserve, against
	// cfg.MaxInFlightTokens.
	inFlightTokens int64
	coolUntil      time.Time
}

// NewLocal returns a local limiter with pools; more can be set later.
func NewLocal(pools ...Pool) (*Local, error) {
	l := &Local{pools: map[string]*localPool{}, inFlightRetry: DefaultInFlightRetry, now: time.Now}
	for _, p := range pools {
		if err := l.setPool(p); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// SetPool creates pool or changes its limits; buckets keep their levels
// (clamped to the new bursts).
func (l *Local) SetPool(_ context.Context, pool Pool) error { return l.setPool(pool) }

func (l *Local) setPool(pool Pool) error {
	pool, err := pool.withDefaults()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if p, ok := l.pools[pool.Name]; ok {
		p.cfg = pool
		p.requests.SetLimitAt(now, perSecond(int64(pool.RPM)))
		p.requests.SetBurstAt(now, pool.RequestBurst)
		p.tokens.SetLimitAt(now, perSecond(pool.TPM))
		p.tokens.SetBurstAt(now, burstInt(pool.TokenBurst))
		return nil
	}
	l.pools[pool.Name] = &localPool{
		cfg:      pool,
		requests: rate.NewLimiter(perSecond(int64(pool.RPM)), pool.RequestBurst),
		tokens:   rate.NewLimiter(perSecond(pool.TPM), burstInt(pool.TokenBurst)),
	}
	return nil
}

func perSecond(perMinute int64) rate.Limit { return rate.Limit(float64(perMinute) / 60) }

func burstInt(b int64) int { return int(min(b, math.MaxInt32)) }

// Acquire grants req or reports how long to wait; see Limiter.
func (l *Local) Acquire(_ context.Context, req Request) (*Permit, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pools[req.Pool]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPool, req.Pool)
	}
	if err := neverAdmissible(p.cfg, req); err != nil {
		return nil, err
	}
	now := l.now()
	if wait := p.coolUntil.Sub(now); wait > 0 {
		return nil, &WaitError{Pool: req.Pool, Reason: ReasonCooldown, RetryAfter: wait}
	}
	if p.inFlight >= p.cfg.MaxInFlight {
		return nil, &WaitError{Pool: req.Pool, Reason: ReasonInFlight, RetryAfter: l.inFlightRetry}
	}
	if p.cfg.MaxInFlightTokens > 0 && p.inFlightTokens+req.Tokens > p.cfg.MaxInFlightTokens {
		return nil, &WaitError{Pool: req.Pool, Reason: ReasonInFlightTokens, RetryAfter: l.inFlightRetry}
	}
	r := p.requests.ReserveN(now, 1)
	t := p.tokens.ReserveN(now, int(req.Tokens))
	rd, td := r.DelayFrom(now), t.DelayFrom(now)
	if rd > 0 || td > 0 {
		// All or nothing: give back what was just reserved. CancelAt
		// restores a reservation made at the same instant exactly.
		r.CancelAt(now)
		t.CancelAt(now)
		if rd >= td {
			return nil, &WaitError{Pool: req.Pool, Reason: ReasonRequests, RetryAfter: rd}
		}
		return nil, &WaitError{Pool: req.Pool, Reason: ReasonTokens, RetryAfter: td}
	}
	p.inFlight++
	p.inFlightTokens += req.Tokens
	return &Permit{ID: uuid.Must(uuid.NewV7()), Pool: req.Pool, Tenant: req.Tenant, Tokens: req.Tokens, Acquired: now, release: l.release}, nil
}

func (l *Local) release(_ context.Context, permit *Permit, o CallOutcome) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pools[permit.Pool]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPool, permit.Pool)
	}
	now := l.now()
	p.inFlight--
	p.inFlightTokens = max(0, p.inFlightTokens-permit.Tokens)
	var refund int64
	switch {
	case o.Result == CallNotSent:
		p.requests.ReserveN(now, -1)
		refund = permit.Tokens
	case o.Result == CallAnswered && !p.cfg.ChargeReserved,
		o.Result == CallUncertain && p.cfg.RefundUncertain:
		refund = permit.Tokens - o.used()
	}
	switch {
	case refund > 0:
		// A negative reservation adds tokens; the bucket is capped at its
		// burst on its next use.
		p.tokens.ReserveN(now, -int(min(refund, p.cfg.TokenBurst)))
	case refund < 0:
		// The provider counted more than was reserved: a debt that delays
		// later grants. ReserveN lets the bucket go negative.
		p.tokens.ReserveN(now, int(min(-refund, p.cfg.TokenBurst)))
	}
	return nil
}

// Cooldown stops this process from acquiring from pool for d; it only
// extends.
func (l *Local) Cooldown(_ context.Context, pool string, d time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pools[pool]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	if until := l.now().Add(d); until.After(p.coolUntil) {
		p.coolUntil = until
	}
	return nil
}

// LowerRemaining lowers pool's buckets to what the provider reported left.
func (l *Local) LowerRemaining(_ context.Context, pool string, r Remaining) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pools[pool]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	now := l.now()
	lower := func(lim *rate.Limiter, remaining *int64) {
		if remaining == nil {
			return
		}
		if excess := lim.TokensAt(now) - float64(*remaining); excess >= 1 {
			lim.ReserveN(now, int(min(excess, float64(lim.Burst()))))
		}
	}
	lower(p.requests, r.Requests)
	lower(p.tokens, r.Tokens)
	return nil
}

// InFlight reports the permits pool has out.
func (l *Local) InFlight(pool string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.pools[pool]; ok {
		return p.inFlight
	}
	return 0
}

// FailurePolicy says what the Postgres limiter does while its database
// cannot be reached. The zero value fails closed: nothing is admitted until
// the database answers again.
//
// With Fraction > 0 each process may admit, for at most For after the
// first failed call of an outage, from a local limiter holding Fraction of
// each pool's rates, bursts and in-flight limit (rounded down, at least 1
// in-flight and 1 request of burst). Across N processes the worst case in
// an outage of any length is therefore
//
//	requests:  N · (floor(Fraction·RequestBurst) + Fraction·RPM/60 · For)
//	tokens:    N · (Fraction·TokenBurst + Fraction·TPM/60 · For)
//	in flight: MaxInFlight (permits granted before the outage) + N · max(1, floor(Fraction·MaxInFlight))
//	in-flight tokens: MaxInFlightTokens + N · max(1, floor(Fraction·MaxInFlightTokens))
//
// on top of what the shared limiter admitted, since the local allowance
// cannot see it. After For, the process fails closed until a statement
// succeeds again, which ends the outage and discards the local buckets.
// A request larger than the local token burst (or in-flight token budget)
// is refused with ErrUnavailable, not ErrNeverAdmissible: it fits the real
// pool.
type FailurePolicy struct {
	Fraction float64
	For      time.Duration
}

// emergency is the bounded local allowance of a Postgres limiter.
type emergency struct {
	policy FailurePolicy
	now    func() time.Time

	mu      sync.Mutex
	known   map[string]Pool // last limits read from the database
	since   time.Time       // start of the current outage; zero when healthy
	local   *Local          // this outage's allowance
	cooling map[string]time.Time
}

func newEmergency(p FailurePolicy) (*emergency, error) {
	fail := func(field, problem string) (*emergency, error) { return nil, invalid("OnUnavailable."+field, problem) }
	switch {
	case p == FailurePolicy{}:
		return nil, nil
	case !(p.Fraction > 0 && p.Fraction <= 1):
		return fail("Fraction", fmt.Sprintf("is %v; use 0 to fail closed or a fraction in (0, 1]", p.Fraction))
	case p.For <= 0:
		return fail("For", fmt.Sprintf("is %v; an emergency allowance must end: give a positive duration", p.For))
	}
	return &emergency{policy: p, now: time.Now, known: map[string]Pool{}, cooling: map[string]time.Time{}}, nil
}

func (e *emergency) remember(p Pool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.known[p.Name] = p
}

func (e *emergency) knows(pool string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.known[pool]
	return ok
}

func (e *emergency) healthy() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.since, e.local = time.Time{}, nil
}

func (e *emergency) cooldown(pool string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if until := e.now().Add(d); until.After(e.cooling[pool]) {
		e.cooling[pool] = until
	}
}

// acquire grants from the allowance, or says why not; cause is the
// database error that started or continues the outage.
func (e *emergency) acquire(ctx context.Context, req Request, cause error) (*Permit, error) {
	unavailable := func(why string) error {
		return fmt.Errorf("%w (%s): %w", ErrUnavailable, why, cause)
	}
	e.mu.Lock()
	now := e.now()
	if e.since.IsZero() {
		e.since = now
	}
	if now.Sub(e.since) >= e.policy.For {
		e.mu.Unlock()
		return nil, unavailable(fmt.Sprintf("emergency allowance of %v spent", e.policy.For))
	}
	pool, ok := e.known[req.Pool]
	if !ok {
		e.mu.Unlock()
		return nil, unavailable("pool limits never read, no emergency allowance")
	}
	if e.local == nil {
		e.local = &Local{pools: map[string]*localPool{}, inFlightRetry: DefaultInFlightRetry, now: e.now}
	}
	local := e.local
	coolUntil := e.cooling[req.Pool]
	e.mu.Unlock()

	if wait := coolUntil.Sub(now); wait > 0 {
		return nil, &WaitError{Pool: req.Pool, Reason: ReasonCooldown, RetryAfter: wait}
	}
	if err := local.ensure(ctx, scaled(pool, e.policy.Fraction)); err != nil {
		return nil, unavailable(err.Error())
	}
	p, err := local.Acquire(ctx, req)
	if err != nil && !errors.Is(err, ErrWait) {
		return nil, unavailable(err.Error())
	}
	return p, err
}

// ensure sets pool only if the limiter does not have it yet, so a second
// caller does not reset the buckets the first one drew from.
func (l *Local) ensure(ctx context.Context, pool Pool) error {
	l.mu.Lock()
	_, ok := l.pools[pool.Name]
	l.mu.Unlock()
	if ok {
		return nil
	}
	return l.SetPool(ctx, pool)
}

// scaled is f of p, rounded down, never below what keeps the pool usable.
func scaled(p Pool, f float64) Pool {
	return Pool{
		Name:         p.Name,
		RPM:          max(1, int(f*float64(p.RPM))),
		TPM:          max(1, int64(f*float64(p.TPM))),
		MaxInFlight:  max(1, int(f*float64(p.MaxInFlight))),
		RequestBurst: max(1, int(f*float64(p.RequestBurst))),
		TokenBurst:   max(1, int64(f*float64(p.TokenBurst))),
		// A budget stays a budget (0 is none): its fraction, at least 1.
		MaxInFlightTokens: min(p.MaxInFlightTokens, max(1, int64(f*float64(p.MaxInFlightTokens)))),
		ChargeReserved:    p.ChargeReserved,
		RefundUncertain:   p.RefundUncertain,
	}
}

// State reads pool's limits and current levels.
func (l *Local) State(_ context.Context, pool string) (PoolState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pools[pool]
	if !ok {
		return PoolState{}, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	now := l.now()
	return PoolState{
		Pool:           p.cfg,
		RequestLevel:   p.requests.TokensAt(now),
		TokenLevel:     p.tokens.TokensAt(now),
		InFlight:       p.inFlight,
		InFlightTokens: p.inFlightTokens,
		Cooldown:       max(p.coolUntil.Sub(now), 0),
	}, nil
}

// Ready reports whether pool could grant a request of tokens now; see
// Postgres.Ready.
func (l *Local) Ready(ctx context.Context, pool string, tokens int64) error {
	s, err := l.State(ctx, pool)
	if err != nil {
		return err
	}
	return s.ready(Request{Pool: pool, Tokens: tokens}, l.inFlightRetry)
}
