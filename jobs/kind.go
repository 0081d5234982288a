package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

// ClassMalformedPayload is the class of a job whose payload a typed handler
// could not decode into its kind's arguments: terminal at once, since every
// retry would read the same bytes.
const ClassMalformedPayload = "malformed_payload"

// MalformedPayloadError reports a payload that does not decode into its
// kind's arguments. The runner fails the job at once with class
// ClassMalformedPayload.
type MalformedPayloadError struct {
	Kind string
	Err  error
}

func (e *MalformedPayloadError) Error() string {
	return fmt.Sprintf("malformed payload for kind %q: %v", e.Kind, e.Err)
}
func (e *MalformedPayloadError) Unwrap() error { return e.Err }

// Kind is a job kind with typed arguments A and a typed result R. Declare
// one per kind, once, and use the same value to enqueue (Kind.Enqueue,
// Kind.Accept) and to register the handler (lease.Handle): a misspelt kind
// is then a compile error, not a job that waits forever.
//
//	var Extract = jobs.NewKind[ExtractArgs, Totals]("invoice.extract")
//
// The payload is A encoded with encoding/json; the handler's R is encoded
// the same way into the job's result. A and R must therefore encode to JSON
// (a struct, a map, json.RawMessage); decoding ignores unknown fields, so a
// producer that adds a field does not break the handlers still running the
// older version.
type Kind[A, R any] struct{ name string }

// NewKind names a kind. The name is checked where it is used (Enqueue
// refuses a malformed one with a *llmqtype.ValidationError naming it), not here, so
// that a Kind can be a package-level value without a panic.
func NewKind[A, R any](name string) Kind[A, R] { return Kind[A, R]{name: name} }

// Name is the kind's name, as stored in Job.Kind.
func (k Kind[A, R]) Name() string { return k.name }

// EnqueueOptions are the fields of EnqueueParams other than Tenant, Kind
// and Payload, with the same meaning and defaults.
type EnqueueOptions struct {
	Queue           string
	Priority        int
	IdempotencyKey  string
	RequestHash     string
	GroupKey        string
	MaxAttempts     int
	AvailableAt     time.Time
	DeadlineAt      time.Time
	EstimatedTokens int64
	Reuse           *Reuse
}

// Params encodes args into the EnqueueParams of a job of this kind, for
// EnqueueMany or the raw API.
func (k Kind[A, R]) Params(tenant string, args A, opts EnqueueOptions) (EnqueueParams, error) {
	payload, err := json.Marshal(args)
	if err != nil {
		return EnqueueParams{}, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Payload",
			Problem: fmt.Sprintf("the arguments of kind %q do not encode to JSON: %v", k.name, err)}
	}
	return EnqueueParams{
		Tenant: tenant, Kind: k.name, Payload: payload,
		Queue: opts.Queue, Priority: opts.Priority,
		IdempotencyKey: opts.IdempotencyKey, RequestHash: opts.RequestHash, GroupKey: opts.GroupKey,
		MaxAttempts: opts.MaxAttempts, AvailableAt: opts.AvailableAt, DeadlineAt: opts.DeadlineAt,
		EstimatedTokens: opts.EstimatedTokens, Reuse: opts.Reuse,
	}, nil
}

// Enqueue accepts args as a job of this kind on db (the caller's
// transaction, or a pool). See Store.Enqueue.
func (k Kind[A, R]) Enqueue(ctx context.Context, store Store, db DBTX, tenant string, args A, opts EnqueueOptions) (EnqueueResult, error) {
	params, err := k.Params(tenant, args, opts)
	if err != nil {
		return EnqueueResult{}, err
	}
	return store.Enqueue(ctx, db, params)
}

// Accept is the recipe for accepting a job together with the service's own
// row, idempotently. In one transaction on db it calls write, which makes
// the service's own writes on tx and returns the job's arguments (which
// typically name the row it wrote), then enqueues them. When the
// idempotency key is already taken by the same request, the whole
// transaction is rolled back, so a retried request leaves no second
// service row, and the earlier job is returned with Existing set. Any
// error from write or the enqueue rolls everything back. When db is the
// caller's own transaction, Accept works in a savepoint of it: on Existing
// or an error only what write did is undone, and the caller decides about
// the rest. Concurrent Accepts of one key resolve like Enqueue's: one
// commits its row and job, the others wait for it and return Existing
// with their rows rolled back.
//
// With an IdempotencyKey, opts.RequestHash is required: the payload holds
// what write generated (a fresh row id), so a hash of it would differ on
// every retry and turn each one into ErrIdempotencyConflict. Hash the
// client's request instead (RequestHash).
func (k Kind[A, R]) Accept(ctx context.Context, store Store, db DBTX, tenant string, opts EnqueueOptions,
	write func(ctx context.Context, tx pgx.Tx) (A, error)) (EnqueueResult, error) {
	if opts.IdempotencyKey != "" && opts.RequestHash == "" {
		return EnqueueResult{}, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "RequestHash",
			Problem: "is required with an IdempotencyKey in Accept: set it to jobs.RequestHash(the client's request), " +
				"since a hash of the payload (which holds ids written in this transaction) differs on every retry"}
	}
	var res EnqueueResult
	errExisting := errors.New("existing") // rolls the transaction back
	err := dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		args, err := write(ctx, tx)
		if err != nil {
			return err
		}
		res, err = k.Enqueue(ctx, store, tx, tenant, args, opts)
		if err == nil && res.Existing {
			return errExisting
		}
		return err
	})
	// A savepoint that could not be rolled back leaves write's rows in the
	// caller's transaction: that is an error, even on the Existing path.
	if errors.Is(err, errExisting) && !errors.Is(err, dbsql.ErrSavepointLeftOpen) {
		return res, nil
	}
	return res, err
}

// Args decodes job's payload into the kind's arguments. A payload that
// does not decode is a *MalformedPayloadError; so is a job of another kind.
func (k Kind[A, R]) Args(job *Job) (A, error) {
	var args A
	if job.Kind != k.name {
		return args, &MalformedPayloadError{Kind: k.name, Err: fmt.Errorf("job %s is of kind %q", job.ID, job.Kind)}
	}
	payload := job.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if err := json.Unmarshal(payload, &args); err != nil {
		return args, &MalformedPayloadError{Kind: k.name, Err: err}
	}
	return args, nil
}

// Result decodes a finished job's result into the kind's result type. A
// job without a result decodes to R's zero value.
func (k Kind[A, R]) Result(job *Job) (R, error) {
	var r R
	if len(job.Result) == 0 || string(job.Result) == "null" {
		return r, nil
	}
	if err := json.Unmarshal(job.Result, &r); err != nil {
		return r, fmt.Errorf("jobs: result of job %s (kind %q): %w", job.ID, k.name, err)
	}
	return r, nil
}

// EncodeResult encodes a handler's result for the runner. It is what
// lease.Handle does with a typed handler's return.
func (k Kind[A, R]) EncodeResult(r R) (json.RawMessage, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("jobs: result of kind %q does not encode to JSON: %w", k.name, err)
	}
	return b, nil
}

// NeedsReview is NeedsReview with a typed result: the error a handler of
// this kind returns to end its attempt as REVIEW_REQUIRED with result
// (encoded as EncodeResult does; one that does not encode is kept as its
// error text, so the reviewer still sees why).
func (k Kind[A, R]) NeedsReview(result R, reason string) error {
	b, err := k.EncodeResult(result)
	if err != nil {
		b = OutputAsResult([]byte(err.Error()))
	}
	return NeedsReview(b, reason)
}
