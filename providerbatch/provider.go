package providerbatch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
)

// Provider is a provider's batch API as a Submitter uses it. The adapters
// implement it: provider/openai.Batches (Files and Batches) and, in the
// same shape, any other provider's. Every method is one or a few HTTP
// calls; none retries (the Submitter does, with backoff).
type Provider interface {
	// Name is the provider's name as submissions record it ("openai").
	Name() string
	// Limits are the provider's limits on one batch. The Submitter splits
	// what it gathers to stay within them (and within Config.Limits).
	Limits() Limits
	// Create sends one batch and returns the provider's id for it. It tags
	// the batch with b.Submission where the provider keeps tags, so that
	// Find can see it after a crash.
	Create(ctx context.Context, b Batch) (string, error)
	// Find returns the ids of the provider batches that may be lost's. A
	// provider that keeps tags returns every batch tagged with
	// lost.Submission (more than one: a paused predecessor sent it
	// twice). One that keeps none matches by shape: the one batch created
	// since lost.Since holding lost.Requests requests that no submission
	// of the pool knows (lost.Known); none when there is no such batch,
	// and ErrCannotFind when there are several.
	Find(ctx context.Context, lost Lost) ([]string, error)
	// Status reads one batch.
	Status(ctx context.Context, id string) (Status, error)
	// Results reads an ended batch's results, one call of fn per result,
	// in the provider's order; fn's error stops the read and is returned.
	// A line that cannot be read is passed with Result.Problem set.
	Results(ctx context.Context, id string, fn func(Result) error) error
	// Cancel asks the provider to cancel a batch. Its requests that were
	// not answered come back from Results as RequestCancelled.
	Cancel(ctx context.Context, id string) error
}

// ErrCannotFind is returned by Provider.Find when it cannot tell which
// of the provider's batches is the submission's (several untagged batches
// of its shape): the submission is sent again.
var ErrCannotFind = errors.New("providerbatch: the provider cannot find batches by submission")

// Lost is what a Submitter knows of a submission the provider may hold
// without llmq knowing its id: a predecessor died between the provider's
// create and recording its id, or the create's answer was lost.
type Lost struct {
	Submission uuid.UUID
	// Requests is how many requests it was sent with.
	Requests int
	// Since is when it was recorded, less a minute for the clocks: the
	// provider created it, if at all, after that.
	Since time.Time
	// Known holds the provider ids the pool's submissions since Since
	// have recorded: none of those batches is this one.
	Known map[string]bool
}

// Limits bound one batch. Zero fields mean no limit of that kind (in
// Config.Limits: the provider's).
type Limits struct {
	// MaxRequests is the most requests in one batch.
	MaxRequests int
	// MaxBytes is the most bytes of encoded requests in one batch (for
	// OpenAI, of the input file: a line per request).
	MaxBytes int64
	// MaxEnqueuedTokens is the most estimated input tokens a pool may
	// have in batches not yet ended (OpenAI's enqueued-token limit per
	// model). The Submitter sends no new batch that would exceed it.
	MaxEnqueuedTokens int64
}

// min is l with each limit lowered to o's where o sets one.
func (l Limits) min(o Limits) Limits {
	lower := func(a, b int64) int64 {
		if b > 0 && (a == 0 || b < a) {
			return b
		}
		return a
	}
	return Limits{
		MaxRequests:       int(lower(int64(l.MaxRequests), int64(o.MaxRequests))),
		MaxBytes:          lower(l.MaxBytes, o.MaxBytes),
		MaxEnqueuedTokens: lower(l.MaxEnqueuedTokens, o.MaxEnqueuedTokens),
	}
}

// Batch is one batch to create.
type Batch struct {
	// Submission is llmq's id for it (provider_submissions.id).
	Submission uuid.UUID
	// Model is the model every request names.
	Model string
	// Requests are the batch's requests, each with a custom id unique in
	// the batch.
	Requests []Request
}

// Request is one request of a batch.
type Request struct {
	// CustomID names the request in the provider's results: the job's id.
	CustomID string
	// Body is the request's JSON body as the provider's synchronous API
	// takes it (a Codec's Encode).
	Body json.RawMessage
}

// Status is a provider batch's state.
type Status struct {
	// State is the provider's own word for it ("in_progress", "ended").
	State string
	// Ended says the batch will change no more: its results can be read.
	Ended bool
	// Failed says the provider refused the batch as a whole (OpenAI's
	// "failed": an input it would not take); Reason says why. Its requests
	// were not run.
	Failed bool
	Reason string
}

// Result is the outcome of one request of a batch.
type Result struct {
	// CustomID is the request's custom id.
	CustomID string
	// Body is the answer's JSON body when the request succeeded.
	Body json.RawMessage
	// Err is the request's own failure; nil on success.
	Err *RequestError
	// Problem says why the line could not be read; the other fields are
	// then whatever could be read of it.
	Problem string
}

// RequestError is a request's failure inside a batch.
type RequestError struct {
	// Kind says what happened to the request.
	Kind RequestErrorKind
	// Status is the HTTP status the provider gave the request, when it
	// gave one.
	Status int
	// Code and Message are the provider's.
	Code, Message string
}

func (e *RequestError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("provider batch request %s (HTTP %d, %s): %s", e.Kind, e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("provider batch request %s (%s): %s", e.Kind, e.Code, e.Message)
}

// RequestErrorKind classifies a request's failure inside a batch.
type RequestErrorKind string

// The kinds of request failure.
const (
	// RequestRefused: the provider refused the request itself (HTTP 4xx
	// other than 408, 409 and 429). Terminal: the same request would be
	// refused again.
	RequestRefused RequestErrorKind = "refused"
	// RequestFailed: the provider failed the request (5xx, 429, 408, 409,
	// or no status). Retried as a transient failure.
	RequestFailed RequestErrorKind = "failed"
	// RequestExpired: the batch ended before the request ran. The job
	// returns to waiting without counting an attempt.
	RequestExpired RequestErrorKind = "expired"
	// RequestCancelled: the batch was cancelled before the request ran.
	// The job returns to waiting without counting an attempt.
	RequestCancelled RequestErrorKind = "cancelled"
)

// StatusKind is the kind of a request failure that carries an HTTP status.
func StatusKind(status int) RequestErrorKind {
	if status >= 400 && status < 500 && status != 408 && status != 409 && status != 429 {
		return RequestRefused
	}
	return RequestFailed
}

// ReadResults reads a batch's results file, JSON Lines, as it comes:
// each non-blank line, parsed by parse (the provider's line format), is
// passed to fn, whose error stops the read and is returned. Lines have no
// length limit: one holds a whole answer. The adapters' Results use it.
func ReadResults(r io.Reader, parse func(line []byte) Result, fn func(Result) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if ferr := fn(parse(line)); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
