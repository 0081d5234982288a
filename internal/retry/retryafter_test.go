package retry_test

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/retry"
)

// now has a fraction of a second, so the date cases check that the wait is
// measured from now exactly and not rounded to whole seconds.
var now = time.Date(2015, 10, 21, 7, 28, 0, 250_000_000, time.UTC)

type parseCase struct {
	value string
	want  time.Duration
	ok    bool
}

var retryAfterCases = []parseCase{
	{"0", 0, true},
	{"120", 2 * time.Minute, true},
	{" 7 ", 7 * time.Second, true},
	{"\t120\r\n", 2 * time.Minute, true},
	{"007", 7 * time.Second, true},
	{"86400", retry.MaxRetryAfter, true},
	{"86401", retry.MaxRetryAfter, true},
	{"99999999999999999999999", retry.MaxRetryAfter, true},
	{"9223372036854775808", retry.MaxRetryAfter, true}, // 2^63: would wrap an int64
	{"0000000000000000000000000000042", 42 * time.Second, true},

	{"", 0, false},
	{"   ", 0, false},
	{"abc", 0, false},
	{"-5", 0, false},
	{"+5", 0, false},
	{"1.5", 0, false},
	{"1e3", 0, false},
	{"0x10", 0, false},
	{"1 2", 0, false},
	{"1_000", 0, false},
	{"١٢", 0, false}, // Arabic-Indic digits are not ASCII digits

	// IMF-fixdate, the form servers must send.
	{"Wed, 21 Oct 2015 07:30:00 GMT", time.Minute + 59*time.Second + 750*time.Millisecond, true},
	{"  Wed, 21 Oct 2015 07:30:00 GMT  ", time.Minute + 59*time.Second + 750*time.Millisecond, true},
	{"Wed, 21 Oct 2015 07:28:00 GMT", 0, true}, // 250ms ago: retry now
	{"Wed, 21 Oct 2015 07:00:00 GMT", 0, true},
	{"Thu, 01 Jan 1970 00:00:00 GMT", 0, true},
	{"Thu, 22 Oct 2015 07:28:00 GMT", 24*time.Hour - 250*time.Millisecond, true},
	{"Fri, 23 Oct 2015 07:28:00 GMT", retry.MaxRetryAfter, true},
	{"Fri, 31 Dec 9999 23:59:59 GMT", retry.MaxRetryAfter, true},
	// The obsolete forms http.ParseTime still accepts: RFC 850, and ANSI C
	// asctime, which pads a one-digit day with a space.
	{"Wednesday, 21-Oct-15 07:29:00 GMT", 59*time.Second + 750*time.Millisecond, true},
	{"Wed Oct 21 07:29:30 2015", time.Minute + 29*time.Second + 750*time.Millisecond, true},
	{"Thu Oct  1 07:29:30 2015", 0, true},

	// Garbage dates.
	{"Wed, 32 Oct 2015 07:28:00 GMT", 0, false},
	{"Wed, 21 Oct 2015 25:00:00 GMT", 0, false},
	{"Wed, 21 Foo 2015 07:28:00 GMT", 0, false},
	{"Wed, 21 Oct 2015 07:28:00 PST", 0, false}, // IMF-fixdate is always GMT
	{"Wed, 21 Oct 2015 07:28:00", 0, false},
	{"21 Oct 2015 07:28:00 GMT", 0, false},
	{"2015-10-21T07:30:00Z", 0, false},
	{"Wed, 21 Oct 2015 07:30:00 GMT trailing", 0, false},
}

var retryAfterMSCases = []parseCase{
	{"1500", 1500 * time.Millisecond, true},
	{"20.5", 20*time.Millisecond + 500*time.Microsecond, true},
	{"0", 0, true},
	{"0.0", 0, true},
	{" 250 ", 250 * time.Millisecond, true},
	{"0.000001", time.Nanosecond, true},
	{"0.0000009", 0, true}, // below a nanosecond: truncated
	{"1.123456789", time.Millisecond + 123456*time.Nanosecond, true},
	{"86399999.9999999", retry.MaxRetryAfter - time.Nanosecond, true},
	{"86400000", retry.MaxRetryAfter, true},
	{"86400000.5", retry.MaxRetryAfter, true},
	{"99999999999999999999999", retry.MaxRetryAfter, true},
	{"99999999999999999999999.5", retry.MaxRetryAfter, true},

	{"", 0, false},
	{"-1", 0, false},
	{"-0", 0, false},
	{"+1", 0, false},
	{"NaN", 0, false},
	{"Inf", 0, false},
	{"+Inf", 0, false},
	{"infinity", 0, false},
	{"1e400", 0, false},
	{"1e3", 0, false},
	{"0x10", 0, false},
	{"1_000", 0, false},
	{"1.", 0, false},
	{".5", 0, false},
	{".", 0, false},
	{"1.2.3", 0, false},
	{"1,5", 0, false},
	{"1 5", 0, false},
	{"abc", 0, false},
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range retryAfterCases {
		got, ok := retry.ParseRetryAfter(tc.value, now)
		require.Equal(t, tc.ok, ok, "%q", tc.value)
		require.Equal(t, tc.want, got, "%q", tc.value)
	}
}

func TestParseRetryAfterMS(t *testing.T) {
	t.Parallel()
	for _, tc := range retryAfterMSCases {
		got, ok := retry.ParseRetryAfterMS(tc.value)
		require.Equal(t, tc.ok, ok, "%q", tc.value)
		require.Equal(t, tc.want, got, "%q", tc.value)
	}
}

var (
	digits  = regexp.MustCompile(`^\d+$`) // RE2's \d is ASCII only
	decimal = regexp.MustCompile(`^\d+(\.\d+)?$`)
)

// clampedCount is digits as a count of unit, clamped to MaxRetryAfter, by way
// of strconv rather than the package's own loop.
func clampedCount(t testing.TB, s string, unit time.Duration) time.Duration {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return retry.MaxRetryAfter
	}
	require.NoError(t, err)
	if n > uint64(retry.MaxRetryAfter/unit) {
		return retry.MaxRetryAfter
	}
	return time.Duration(n) * unit
}

// FuzzParseRetryAfter checks that no header value panics or escapes
// [0, MaxRetryAfter], that delta-seconds mean exactly that many seconds, and
// that everything else is accepted exactly when net/http's ParseTime accepts
// it.
//
//	go test -run '^$' -fuzz '^FuzzParseRetryAfter$' ./internal/retry
func FuzzParseRetryAfter(f *testing.F) {
	for _, tc := range retryAfterCases {
		f.Add(tc.value)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got, ok := retry.ParseRetryAfter(value, now)
		if !ok {
			require.Zero(t, got)
		}
		require.GreaterOrEqual(t, got, time.Duration(0))
		require.LessOrEqual(t, got, retry.MaxRetryAfter)

		trimmed := strings.TrimSpace(value)
		if digits.MatchString(trimmed) {
			require.True(t, ok, "delta-seconds %q refused", value)
			require.Equal(t, clampedCount(t, trimmed, time.Second), got, "%q", value)
			return
		}
		_, err := http.ParseTime(trimmed)
		require.Equal(t, err == nil, ok, "%q: net/http's ParseTime says %v", value, err)
	})
}

// FuzzParseRetryAfterMS checks that no header value panics or escapes
// [0, MaxRetryAfter], that exactly the plain decimals are accepted, and that
// their value agrees with strconv.ParseFloat to within a nanosecond.
//
//	go test -run '^$' -fuzz '^FuzzParseRetryAfterMS$' ./internal/retry
func FuzzParseRetryAfterMS(f *testing.F) {
	for _, tc := range retryAfterMSCases {
		f.Add(tc.value)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got, ok := retry.ParseRetryAfterMS(value)
		if !ok {
			require.Zero(t, got)
		}
		require.GreaterOrEqual(t, got, time.Duration(0))
		require.LessOrEqual(t, got, retry.MaxRetryAfter)

		trimmed := strings.TrimSpace(value)
		require.Equal(t, decimal.MatchString(trimmed), ok, "%q", value)
		if !ok {
			return
		}
		if digits.MatchString(trimmed) {
			require.Equal(t, clampedCount(t, trimmed, time.Millisecond), got, "%q", value)
		}
		ms, err := strconv.ParseFloat(trimmed, 64)
		if err != nil { // out of float64's range: huge, so clamped
			require.ErrorIs(t, err, strconv.ErrRange)
			require.Equal(t, retry.MaxRetryAfter, got, "%q", value)
			return
		}
		want := min(ms*float64(time.Millisecond), float64(retry.MaxRetryAfter))
		// got truncates below a nanosecond; float64 rounding adds a little
		// more at the top of the range.
		require.InDelta(t, want, float64(got), 1.01, "%q", value)
	})
}
