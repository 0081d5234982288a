package lease

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/llmq/llmq/jobs"
)

// Handler runs one attempt of a job. It returns the job's result or an
// error that says how the attempt ended:
//
//   - nil: SUCCEEDED with the result.
//   - jobs.NeedsReview(result, reason): REVIEW_REQUIRED.
//   - jobs.InvalidOutput(err, output): retried within the runner's
//     invalid-output budget, then REVIEW_REQUIRED or FAILED_TERMINAL.
//   - jobs.Permanent(err): FAILED_TERMINAL at once.
//   - jobs.RetryAfter(err, d) or any other error: retried with backoff (at
//     least d), while attempts and the deadline allow.
//   - jobs.Snooze(d) or a *jobs.SnoozeError: put off for d without counting
//     the attempt against the retry budget (for waits that are not the
//     job's fault: no admission permit yet, an open circuit breaker).
//
// The result contract: a successful result is one JSON value that
// PostgreSQL's jsonb can hold (valid UTF-8, no \u0000 or unpaired
// surrogate escape, numbers within numeric's range), small, or a
// reference to where a large result lives; nil means none. A result that breaks it is the
// handler's defect, not the model's: that job alone fails at once
// (FAILED_TERMINAL, class jobs.ClassHandlerDefect, not retried, since a
// retry would pay the provider again for the same bug), with the bytes
// kept as a JSON string in its result. The output given to NeedsReview or
// InvalidOutput may be anything a model said: JSON is kept as it is, other
// text as a JSON string holding it (jobs.OutputAsResult), so the job shows
// what the model said. An outcome PostgreSQL still refuses (a number jsonb
// cannot hold, a host trigger's error) fails its job alone, with class
// jobs.ClassUnrecordable. No outcome ever affects another job's.
//
// The context is cancelled when the attempt times out, when the lease is
// lost, when a client cancels the job, and at shutdown; a handler must
// return promptly then. One that keeps running HungGrace past its timeout
// is given up as hung: its lease is abandoned, the job is retried by
// whichever runner claims it after the lease expired, and what the handler
// returns at last is recorded as stale; its goroutine keeps its worker slot
// until then. Give every provider call a deadline from ctx. A panic is
// recovered and recorded as a failed attempt. The handler runs after the
// claim committed, never inside a transaction: it may take as long as the
// attempt timeout. The context also carries the attempt's logger (Logger)
// and, with Config.TracerProvider, its span.
type Handler interface {
	Work(ctx context.Context, job *jobs.Job) (json.RawMessage, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *jobs.Job) (json.RawMessage, error)

// Work calls f.
func (f HandlerFunc) Work(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
	return f(ctx, job)
}

// usageKey finds an attempt's usage recorder in its context.
type usageKey struct{}

type usageRecorder struct {
	mu    sync.Mutex
	usage jobs.Usage
	// parent is the attempt's recorder when this one is a step's: what a
	// step records counts for its attempt too.
	parent *usageRecorder
}

// RecordUsage adds a provider's reported usage to the current attempt's
// record (tokens add up over several calls), and marks the attempt
// uncertain if u says so. Call it from a handler with the context it was
// given; elsewhere it does nothing. Inside a Step's function it records
// for the step as well as for its attempt.
func RecordUsage(ctx context.Context, u jobs.Usage) {
	r, ok := ctx.Value(usageKey{}).(*usageRecorder)
	if !ok {
		return
	}
	for ; r != nil; r = r.parent {
		r.add(u)
	}
}

func (r *usageRecorder) add(u jobs.Usage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.usage.InputTokens += u.InputTokens
	r.usage.OutputTokens += u.OutputTokens
	r.usage.Uncertain = r.usage.Uncertain || u.Uncertain
}

// UsageOf returns the usage recorded so far for the attempt whose context
// ctx is (or derives from), through RecordUsage (inside a Step's function:
// the step's); zero elsewhere. Handler
// middleware reads it after the handler returned, e.g. to reconcile an
// admission permit with what the provider reported.
func UsageOf(ctx context.Context) jobs.Usage {
	r, ok := ctx.Value(usageKey{}).(*usageRecorder)
	if !ok {
		return jobs.Usage{}
	}
	return r.get()
}

func (r *usageRecorder) get() jobs.Usage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.usage
}
