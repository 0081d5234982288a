package admission_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/retry"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func ptr(v int64) *int64 { return &v }

func TestParseSignal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		h      http.Header
		want   admission.Signal
	}{
		{"429 seconds", 429, header("Retry-After", "5"), admission.Signal{Cooldown: 5 * time.Second}},
		{"503 HTTP-date", 503, header("Retry-After", "Mon, 30 Nov 2026 12:00:07 GMT"), admission.Signal{Cooldown: 7 * time.Second}},
		{"retry-after-ms wins", 429, header("Retry-After", "5", "Retry-After-Ms", "1500.5"), admission.Signal{Cooldown: 1500500 * time.Microsecond}},
		{"Retry-After ignored on 200", 200, header("Retry-After", "5"), admission.Signal{}},
		{"Retry-After ignored on 500", 500, header("Retry-After", "5"), admission.Signal{}},
		{"malformed Retry-After", 429, header("Retry-After", "-5"), admission.Signal{}},
		{"huge Retry-After clamps", 429, header("Retry-After", "99999999999999999999"), admission.Signal{Cooldown: retry.MaxRetryAfter}},
		{
			"OpenAI remaining", 200,
			header("X-Ratelimit-Remaining-Requests", "59", "X-Ratelimit-Remaining-Tokens", "149000", "X-Ratelimit-Reset-Requests", "1s", "X-Ratelimit-Reset-Tokens", "6m0s"),
			admission.Signal{Remaining: admission.Remaining{Requests: ptr(59), Tokens: ptr(149000)}},
		},
		{
			"OpenAI exhausted cools down until the reset", 200,
			header("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "20ms", "X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "1m30.5s"),
			admission.Signal{Cooldown: 90500 * time.Millisecond, Remaining: admission.Remaining{Requests: ptr(0), Tokens: ptr(0)}},
		},
		{
			"Anthropic", 200,
			header("Anthropic-Ratelimit-Requests-Remaining", "0", "Anthropic-Ratelimit-Requests-Reset", "2026-11-30T12:00:03Z", "Anthropic-Ratelimit-Tokens-Remaining", "7000"),
			admission.Signal{Cooldown: 3 * time.Second, Remaining: admission.Remaining{Requests: ptr(0), Tokens: ptr(7000)}},
		},
		{
			"both vendors: the lower remaining wins", 200,
			header("X-Ratelimit-Remaining-Tokens", "500", "Anthropic-Ratelimit-Tokens-Remaining", "300"),
			admission.Signal{Remaining: admission.Remaining{Tokens: ptr(300)}},
		},
		{
			"reset in the past means no wait", 200,
			header("Anthropic-Ratelimit-Tokens-Remaining", "0", "Anthropic-Ratelimit-Tokens-Reset", "2026-11-30T11:00:00Z"),
			admission.Signal{Remaining: admission.Remaining{Tokens: ptr(0)}},
		},
		{
			"malformed values are ignored", 200,
			header("X-Ratelimit-Remaining-Requests", "-1", "X-Ratelimit-Remaining-Tokens", "1e3", "X-Ratelimit-Reset-Tokens", "-6s", "Anthropic-Ratelimit-Requests-Remaining", "ten"),
			admission.Signal{},
		},
		{
			"a negative reset is refused", 200,
			header("X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "-6s"),
			admission.Signal{Remaining: admission.Remaining{Tokens: ptr(0)}},
		},
		{
			"a huge count saturates", 200,
			header("X-Ratelimit-Remaining-Tokens", "99999999999999999999999"),
			admission.Signal{Remaining: admission.Remaining{Tokens: ptr(1<<63 - 1)}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, admission.ParseSignal(tc.status, tc.h, now))
		})
	}
}

func FuzzParseSignal(f *testing.F) {
	for _, seed := range [][3]string{
		{"5", "1500", "6m0s"},
		{"Mon, 30 Nov 2026 12:00:07 GMT", "", "1s"},
		{"", "20.5", "20ms"},
		{"-1", "NaN", "-6s"},
		{"99999999999999999999", "1e9", "2562047h47m16.854775807s"},
		{"", "", "9999999999h"},
	} {
		f.Add(429, seed[0], seed[1], "0", seed[2], "2026-11-30T12:00:03Z", "17")
	}
	f.Fuzz(func(t *testing.T, status int, retryAfter, retryAfterMS, remaining, reset, anthropicReset, anthropicRemaining string) {
		h := header("Retry-After", retryAfter, "Retry-After-Ms", retryAfterMS,
			"X-Ratelimit-Remaining-Requests", remaining, "X-Ratelimit-Reset-Requests", reset,
			"X-Ratelimit-Remaining-Tokens", remaining, "X-Ratelimit-Reset-Tokens", reset,
			"Anthropic-Ratelimit-Requests-Remaining", anthropicRemaining, "Anthropic-Ratelimit-Requests-Reset", anthropicReset)
		s := admission.ParseSignal(status, h, now)
		if s.Cooldown < 0 || s.Cooldown > retry.MaxRetryAfter {
			t.Fatalf("cooldown %v out of [0, %v]", s.Cooldown, retry.MaxRetryAfter)
		}
		for _, r := range []*int64{s.Remaining.Requests, s.Remaining.Tokens} {
			if r != nil && *r < 0 {
				t.Fatalf("negative remaining %d", *r)
			}
		}
		if status != 429 && status != 503 && (s.Remaining.Requests == nil || *s.Remaining.Requests != 0) &&
			(s.Remaining.Tokens == nil || *s.Remaining.Tokens != 0) && s.Cooldown != 0 {
			t.Fatalf("cooldown %v without a 429/503 or an exhausted budget", s.Cooldown)
		}
	})
}
