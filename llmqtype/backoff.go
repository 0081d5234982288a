package llmqtype

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

const (
	// DefaultBackoffBase is the ceiling of the first retry's delay when
	// BackoffPolicy.Base is zero.
	DefaultBackoffBase = 2 * time.Second
	// DefaultBackoffCap bounds every delay when BackoffPolicy.Cap is zero: long enough to
	// ride out a provider's rate-limit window, short enough that a job does
	// not sit idle long after the provider recovers.
	DefaultBackoffCap = 60 * time.Second
	// MaxRetryAfter bounds how long a server's Retry-After can postpone a
	// job: a huge or hostile value must not schedule a job for years.
	MaxRetryAfter = 24 * time.Hour
)

// ErrInvalidBackoffPolicy is matched (errors.Is) by every error
// BackoffPolicy.Validate
// returns.
var ErrInvalidBackoffPolicy = errors.New("llmq: invalid backoff policy")

// BackoffPolicy is a full-jitter exponential backoff: the delay before attempt n+1
// after n failed attempts is U(0, min(Cap, Base·2^(n-1))).
type BackoffPolicy struct {
	Base time.Duration // default 2s when zero
	Cap  time.Duration // default 60s when zero
}

// WithDefaults returns p with zero fields replaced by the defaults.
func (p BackoffPolicy) WithDefaults() BackoffPolicy {
	if p.Base == 0 {
		p.Base = DefaultBackoffBase
	}
	if p.Cap == 0 {
		p.Cap = DefaultBackoffCap
	}
	return p
}

// Validate reports a policy that cannot work: negative Base or Cap, or Cap <
// Base (after defaults). The error is a *ValidationError naming the field and
// matches ErrInvalidBackoffPolicy. A Base above 60s with no Cap is therefore an
// error: the default Cap would silently undercut it.
func (p BackoffPolicy) Validate() error {
	fail := func(field, problem string) error {
		return &ValidationError{Kind: ErrInvalidBackoffPolicy, Field: field, Problem: problem}
	}
	switch {
	case p.Base < 0:
		return fail("Base", fmt.Sprintf("is %v; must not be negative (0 means the default of %v)", p.Base, DefaultBackoffBase))
	case p.Cap < 0:
		return fail("Cap", fmt.Sprintf("is %v; must not be negative (0 means the default of %v)", p.Cap, DefaultBackoffCap))
	}
	d := p.WithDefaults()
	if d.Cap < d.Base {
		return fail("Cap", fmt.Sprintf("is %v, less than Base (%v)", d.Cap, d.Base))
	}
	return nil
}

// Ceiling is min(Cap, Base·2^(attempt-1)) for attempt >= 1 (attempt < 1 is
// treated as 1), computed without overflow for any attempt (e.g. attempt
// 10_000). An invalid policy with a negative field has a ceiling of 0.
func (p BackoffPolicy) Ceiling(attempt int) time.Duration {
	p = p.WithDefaults()
	if p.Base < 0 || p.Cap < 0 {
		return 0
	}
	shift := max(attempt, 1) - 1
	// Base<<shift <= Cap exactly when Base <= Cap>>shift, so comparing
	// against the shifted-down Cap decides without ever computing a product
	// that could overflow. Durations are below 2^63, so a shift of 63 or more
	// always reaches Cap.
	if shift >= 63 || p.Base > p.Cap>>shift {
		return p.Cap
	}
	return p.Base << shift
}

// Delay draws U(0, Ceiling(attempt)) using rnd, a function returning a
// uniform float64 in [0,1) (math/rand/v2's Float64 fits); inject it so tests
// are deterministic. A nil rnd means math/rand/v2's Float64. The result is in
// [0, Ceiling(attempt)), or 0 when the ceiling is 0.
func (p BackoffPolicy) Delay(attempt int, rnd func() float64) time.Duration {
	ceiling := p.Ceiling(attempt)
	if ceiling <= 0 {
		return 0
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	r := rnd()
	if !(r > 0) { // also catches NaN
		return 0
	}
	// float64 has 53 bits of mantissa, so near 2^63 the product can round up
	// to the ceiling or past MaxInt64, where conversion is undefined; compare
	// in float64 before converting.
	d := r * float64(ceiling)
	if d >= float64(ceiling) {
		return ceiling - 1
	}
	return time.Duration(d)
}

// Next combines backoff with a server's Retry-After: the delay is
// max(Delay(...), retryAfter) (retryAfter <= 0 means none), so a valid
// Retry-After raises the delay and never lowers it. A retryAfter above
// MaxRetryAfter counts as MaxRetryAfter, whoever parsed it. rnd is drawn from
// exactly once either way, so a seeded sequence stays in step.
func (p BackoffPolicy) Next(attempt int, retryAfter time.Duration, rnd func() float64) time.Duration {
	return max(p.Delay(attempt, rnd), min(retryAfter, MaxRetryAfter))
}
