package llmqtype_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/llmqtype"
)

// A job's next run after a failed attempt: full-jitter backoff, raised by a
// server's Retry-After when it asks for longer. Runners draw from
// math/rand/v2; this example pins the draw to the middle of the range so
// that the output is fixed.
func ExampleBackoffPolicy_Next() {
	policy := llmqtype.BackoffPolicy{Base: time.Second, Cap: 10 * time.Second}
	middle := func() float64 { return 0.5 }
	for attempt := 1; attempt <= 5; attempt++ {
		fmt.Printf("after attempt %d: %v\n", attempt, policy.Next(attempt, 0, middle))
	}
	fmt.Println("with Retry-After 30s:", policy.Next(2, 30*time.Second, middle))
	// Output:
	// after attempt 1: 500ms
	// after attempt 2: 1s
	// after attempt 3: 2s
	// after attempt 4: 4s
	// after attempt 5: 5s
	// with Retry-After 30s: 30s
}

// One errors.As target matches the field errors of every llmq package.
func ExampleValidationError() {
	errInvalid := errors.New("example: invalid input") // a package's sentinel
	err := fmt.Errorf("enqueue: %w", &llmqtype.ValidationError{Kind: errInvalid, Field: "Tenant", Problem: "must not be empty"})

	var verr *llmqtype.ValidationError
	if errors.As(err, &verr) {
		fmt.Println(verr.Field, verr.Problem, errors.Is(err, errInvalid))
	}
	// Output: Tenant must not be empty true
}
