package jobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/retry"
)

// A handler tells the runner how its attempt ended through the error it
// returns. A nil error is success; a plain error is transient and retried
// with backoff. The wrappers below say otherwise, and wrap their cause so
// errors.Is and errors.As still see it.

// PermanentError marks a failure no retry can fix (validation, most 4xx):
// the job fails at once and is dead-lettered.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + errString(e.Err) }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent.
func Permanent(err error) error { return &PermanentError{Err: err} }

// RetryAfterError is a transient failure with the provider's own word on
// when to try again; the delay is at least After.
type RetryAfterError struct {
	Err   error
	After time.Duration
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %s", e.After, errString(e.Err))
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter marks err as transient, to be retried no sooner than after d
// (negative means none). The retry is still refused when it would end after
// the job's deadline.
func RetryAfter(err error, d time.Duration) error {
	return &RetryAfterError{Err: err, After: max(d, 0)}
}

// RetryAfterHeader is RetryAfter with an HTTP Retry-After value
// (delta-seconds or an HTTP-date). A malformed value leaves err a plain
// transient error.
func RetryAfterHeader(err error, value string) error {
	d, ok := retry.ParseRetryAfter(value, time.Now())
	if !ok {
		return err
	}
	return RetryAfter(err, d)
}

// InvalidOutputError reports model output that failed validation. It is
// retried within a small budget; after that the job goes to
// REVIEW_REQUIRED with Output as its result, or fails, by the runner's
// policy.
type InvalidOutputError struct {
	Err    error
	Output json.RawMessage
}

func (e *InvalidOutputError) Error() string { return "invalid output: " + errString(e.Err) }
func (e *InvalidOutputError) Unwrap() error { return e.Err }

// InvalidOutput marks err as invalid model output, keeping output (JSON, or
// nil) for a reviewer.
func InvalidOutput(err error, output json.RawMessage) error {
	return &InvalidOutputError{Err: err, Output: output}
}

// ReviewError ends an attempt with a result a person must look at: the job
// becomes REVIEW_REQUIRED, inspectable but never delivered onward as
// success.
type ReviewError struct {
	Result json.RawMessage
	Reason string
}

func (e *ReviewError) Error() string { return "review required: " + e.Reason }

// NeedsReview returns the error that ends an attempt as REVIEW_REQUIRED.
func NeedsReview(result json.RawMessage, reason string) error {
	return &ReviewError{Result: result, Reason: reason}
}

// SnoozeError puts a job off without counting the attempt: the job waits
// After and runs again, its retry budget untouched (MaxAttempts is raised by
// one, so the attempt counter still only goes up). For waits that are not
// the job's fault: no admission permit, an open circuit breaker. Reason is
// recorded on the attempt's row.
type SnoozeError struct {
	After  time.Duration
	Reason string
}

func (e *SnoozeError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("snoozed for %s", e.After)
	}
	return fmt.Sprintf("snoozed for %s: %s", e.After, e.Reason)
}

// Snooze returns the error that puts a job off for d (negative means no
// wait) without counting the attempt against its retry budget. A snoozed
// job's deadline still holds: one snoozed past it fails with class
// "deadline".
func Snooze(d time.Duration) error { return &SnoozeError{After: max(d, 0)} }

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// Classify says what kind of failure err is: ClassMalformedPayload,
// ClassPermanent, ClassInvalidOutput or ClassTransient, with the
// Retry-After it carries.
func Classify(err error) (class string, retryAfter time.Duration) {
	var (
		malformed *MalformedPayloadError
		permanent *PermanentError
		invalid   *InvalidOutputError
		after     *RetryAfterError
	)
	switch {
	case errors.As(err, &malformed):
		return ClassMalformedPayload, 0
	case errors.As(err, &permanent):
		return ClassPermanent, 0
	case errors.As(err, &invalid):
		return ClassInvalidOutput, 0
	case errors.As(err, &after):
		return ClassTransient, after.After
	}
	return ClassTransient, 0
}
