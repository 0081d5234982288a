package admission

import (
	"context"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/retry"
)

// Signal is what a provider's response says about its pool's quota.
type Signal struct {
	// Cooldown is how long nobody should call the pool: the Retry-After of
	// a 429 or 503 (retry-after-ms preferred, being more precise), or the
	// reset time of a budget reported as exhausted. Zero for none.
	Cooldown time.Duration
	// Remaining is the budget the provider reported left.
	Remaining Remaining
}

// ParseSignal reads a provider response's status and headers at now:
// Retry-After (seconds or HTTP-date) and retry-after-ms on a 429 or 503;
// OpenAI's x-ratelimit-remaining-{requests,tokens} with
// x-ratelimit-reset-{requests,tokens} as Go durations ("6m0s", "1s",
// "20ms"); Anthropic's anthropic-ratelimit-{requests,tokens}-remaining with
// -reset as RFC 3339 times. Malformed or negative values are ignored; waits
// are clamped to llmqtype.MaxRetryAfter (24h). When both vendors' headers appear,
// the lower remaining budget wins.
func ParseSignal(status int, h http.Header, now time.Time) Signal {
	var s Signal
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if d, ok := retry.ParseRetryAfterMS(h.Get("Retry-After-Ms")); ok {
			s.Cooldown = d
		} else if d, ok := retry.ParseRetryAfter(h.Get("Retry-After"), now); ok {
			s.Cooldown = d
		}
	}
	for _, dim := range []struct {
		remaining *(*int64)
		openAI    string
		anthropic string
	}{
		{&s.Remaining.Requests, "requests", "requests"},
		{&s.Remaining.Tokens, "tokens", "tokens"},
	} {
		readRemaining := func(value string, reset time.Duration, hasReset bool) {
			n, ok := parseCount(value)
			if !ok {
				return
			}
			if *dim.remaining == nil || n < **dim.remaining {
				*dim.remaining = &n
			}
			if n == 0 && hasReset {
				s.Cooldown = max(s.Cooldown, reset)
			}
		}
		reset, hasReset := parseGoDuration(h.Get("X-Ratelimit-Reset-" + dim.openAI))
		readRemaining(h.Get("X-Ratelimit-Remaining-"+dim.openAI), reset, hasReset)
		reset, hasReset = parseRFC3339Wait(h.Get("Anthropic-Ratelimit-"+dim.anthropic+"-Reset"), now)
		readRemaining(h.Get("Anthropic-Ratelimit-"+dim.anthropic+"-Remaining"), reset, hasReset)
	}
	return s
}

// parseCount reads a non-negative decimal count, saturating at
// math.MaxInt64.
func parseCount(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	var n int64
	for i := range len(v) {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (math.MaxInt64-int64(c-'0'))/10 {
			n = math.MaxInt64
			continue
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// parseGoDuration reads OpenAI's reset header, a Go duration string
// ("6m0s", "1s", "20ms", "1m30.5s"), refusing signs and clamping to
// llmqtype.MaxRetryAfter.
func parseGoDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 || v[0] == '-' || v[0] == '+' {
		return 0, false
	}
	// time.ParseDuration also rejects overflow, so a huge value is
	// ignored rather than wrapped.
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, false
	}
	return min(max(d, 0), retry.MaxRetryAfter), true
}

// parseRFC3339Wait reads Anthropic's reset header, an RFC 3339 time, as the
// wait from now (0 for a time in the past), clamped.
func parseRFC3339Wait(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return 0, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), retry.MaxRetryAfter), true
}

// Observe applies a provider response to pool through l: a cooldown every
// holder of the pool obeys, and remaining budgets that can only lower what
// l grants. It returns the signal it read. Call it for every response,
// successful or not, before releasing the permit.
func Observe(ctx context.Context, l Limiter, pool string, status int, h http.Header) (Signal, error) {
	s := ParseSignal(status, h, time.Now())
	if s.Cooldown > 0 {
		if err := l.Cooldown(ctx, pool, s.Cooldown); err != nil {
			return s, err
		}
	}
	if err := l.LowerRemaining(ctx, pool, s.Remaining); err != nil {
		return s, err
	}
	return s, nil
}
