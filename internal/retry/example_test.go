package retry_test

import (
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/retry"
)

// A job's next run after a failed attempt: full-jitter backoff, raised by the
// provider's Retry-After when it asks for longer. A runner passes
// math/rand/v2's Float64; this example pins the draw to the middle of the
// range so that the output is fixed.
func ExampleParseRetryAfter() {
	policy := retry.Policy{} // Base 2s, Cap 60s
	middle := func() float64 { return 0.5 }
	now := time.Date(2015, 10, 21, 7, 28, 0, 0, time.UTC)

	for attempt := 1; attempt <= 7; attempt++ {
		fmt.Printf("after attempt %d: %v\n", attempt, policy.Next(attempt, 0, middle))
	}

	// A 429 with "Retry-After: 30" after the second attempt: the server's
	// wait is longer than the 2s drawn, so it wins.
	wait, ok := retry.ParseRetryAfter("30", now)
	fmt.Println("Retry-After 30:", ok, policy.Next(2, wait, middle))

	// An HTTP-date one second away, after the third attempt: shorter than
	// the 4s drawn, so the backoff stands.
	wait, ok = retry.ParseRetryAfter("Wed, 21 Oct 2015 07:28:01 GMT", now)
	fmt.Println("Retry-After in 1s:", ok, policy.Next(3, wait, middle))

	// A malformed header is ignored: plain backoff.
	wait, ok = retry.ParseRetryAfter("soon", now)
	fmt.Println("Retry-After soon:", ok, policy.Next(3, wait, middle))
	// Output:
	// after attempt 1: 1s
	// after attempt 2: 2s
	// after attempt 3: 4s
	// after attempt 4: 8s
	// after attempt 5: 16s
	// after attempt 6: 30s
	// after attempt 7: 30s
	// Retry-After 30: true 30s
	// Retry-After in 1s: true 4s
	// Retry-After soon: false 4s
}
