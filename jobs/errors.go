package jobs

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

var (
	// ErrInvalidParams is matched (errors.Is) by every
	// *llmqtype.ValidationError of this package: the input was refused
	// before anything was written. Its Cause, when set, is ErrUnknownQueue
	// or ErrPayloadTooLarge.
	ErrInvalidParams = errors.New("jobs: invalid params")
	// ErrUnknownQueue is matched when EnqueueParams.Queue is not one of
	// Config.Queues.
	ErrUnknownQueue = errors.New("jobs: unknown queue")
	// ErrPayloadTooLarge is matched when a payload exceeds
	// Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("jobs: payload too large")
	// ErrIdempotencyConflict is matched when an idempotency key is reused
	// with a different request hash (HTTP 409 in servers). Nothing is
	// written; the error is a *ConflictError.
	ErrIdempotencyConflict = errors.New("jobs: idempotency key reused with a different request")
	// ErrNotFound is returned for a job that does not exist for the tenant
	// asking, including another tenant's job.
	ErrNotFound = errors.New("jobs: job not found")
	// ErrAlreadyFinished is returned by Cancel for a job that reached a
	// terminal state other than CANCELLED; the job is returned unchanged.
	ErrAlreadyFinished = errors.New("jobs: job already finished")
)

// ConflictError reports an idempotency key that already belongs to a job
// with a different request hash.
type ConflictError struct {
	// Index is the position in the EnqueueMany batch (0 for Enqueue).
	Index int
	// Tenant and IdempotencyKey are the key that conflicted.
	Tenant         string
	IdempotencyKey string
	// ExistingJobID is the job that holds the key.
	ExistingJobID uuid.UUID
	// DerivedHash is true when the refused request had no RequestHash, so
	// its hash was derived from its kind and payload: a payload holding
	// anything generated per attempt (a new row's id, a timestamp) makes
	// every retry such a conflict, and the message says so.
	DerivedHash bool
}

func (e *ConflictError) Error() string {
	msg := fmt.Sprintf("%v: tenant %q key %q belongs to job %s", ErrIdempotencyConflict, e.Tenant, e.IdempotencyKey, e.ExistingJobID)
	if e.DerivedHash {
		msg += " (this request had no RequestHash, so it was derived from the payload: if the payload holds values generated per request, such as a new row's id, set RequestHash to jobs.RequestHash of the client's request)"
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrIdempotencyConflict) true.
func (e *ConflictError) Unwrap() error { return ErrIdempotencyConflict }
