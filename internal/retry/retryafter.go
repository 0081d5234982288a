package retry

import (
	"strings"
	"time"
)

// httpDateLayouts are the HTTP-date forms net/http's http.ParseTime accepts,
// in its order: IMF-fixdate, then the obsolete RFC 850 and ANSI C forms.
// They are repeated here so that this package does not import net/http.
var httpDateLayouts = [...]string{
	"Mon, 02 Jan 2006 15:04:05 GMT", // http.TimeFormat
	time.RFC850,
	time.ANSIC,
}

// ParseRetryAfter parses an HTTP Retry-After value relative to now:
// delta-seconds ("120") or an HTTP-date ("Wed, 21 Oct 2015 07:28:00 GMT",
// plus the obsolete RFC 850 and ANSI C forms that net/http's http.ParseTime
// accepts). It returns the wait and true, or 0 and false for an empty,
// malformed or negative value. A date in the past means 0 and true (retry
// now). Values above MaxRetryAfter are clamped to it. Leading/trailing
// whitespace is ignored. Delta-seconds must be all ASCII digits (no sign, no
// fraction, no exponent); overflow of huge digit strings must not panic or
// wrap — clamp.
//
// Dates are read in UTC, unlike http.ParseTime, which reads them in the
// local zone: HTTP-dates are always GMT, and the wait must not depend on the
// time zone of the machine a runner happens to run on.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if isDigits(value) {
		return clampedUnits(value, time.Second), true
	}
	for _, layout := range httpDateLayouts {
		t, err := time.ParseInLocation(layout, value, time.UTC)
		if err != nil {
			continue
		}
		// Sub saturates instead of overflowing, so a date centuries away
		// still clamps correctly.
		return min(max(t.Sub(now), 0), MaxRetryAfter), true
	}
	return 0, false
}

// ParseRetryAfterMS parses the non-standard "retry-after-ms" header some LLM
// providers send (a non-negative decimal number of milliseconds, fractions
// allowed, e.g. "1500" or "20.5"); same clamping and (0,false) on
// malformed/negative/NaN/Inf.
//
// The accepted form is digits, optionally followed by "." and more digits,
// after trimming whitespace. Signs, exponents, hexadecimal, "NaN" and "Inf"
// are malformed. It is parsed as a decimal rather than with
// strconv.ParseFloat, so that the grammar stays this narrow and huge values
// clamp instead of becoming infinities. Digits beyond nanosecond precision
// are truncated.
func ParseRetryAfterMS(value string) (time.Duration, bool) {
	value = strings.TrimSpace(value)
	whole, frac, hasPoint := strings.Cut(value, ".")
	if !isDigits(whole) || (hasPoint && !isDigits(frac)) {
		return 0, false
	}
	d := clampedUnits(whole, time.Millisecond)
	if d == MaxRetryAfter {
		return d, true
	}
	// The fraction of a millisecond in nanoseconds: its first six digits.
	var ns time.Duration
	for i := range 6 {
		ns *= 10
		if i < len(frac) {
			ns += time.Duration(frac[i] - '0')
		}
	}
	return min(d+ns, MaxRetryAfter), true
}

// isDigits reports whether s is non-empty and all ASCII digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// clampedUnits is the decimal digits as a count of unit, clamped to
// MaxRetryAfter. It stops reading once the limit is passed, so no digit
// string is long enough to overflow.
func clampedUnits(digits string, unit time.Duration) time.Duration {
	limit := int64(MaxRetryAfter / unit)
	var n int64
	for i := range len(digits) {
		n = n*10 + int64(digits[i]-'0')
		if n > limit {
			return MaxRetryAfter
		}
	}
	return time.Duration(n) * unit
}
