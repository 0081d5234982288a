package lease

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/llmq/llmq/jobs"
)

// KindHandler is a handler registered for one kind; build it with Handle
// and collect several with Kinds.
type KindHandler struct {
	Kind    string
	Handler Handler
}

// Handle adapts a typed handler to the raw one: the payload is decoded into
// the kind's arguments (a payload that does not decode fails the job at
// once, class jobs.ClassMalformedPayload, without calling fn), and fn's
// result is encoded as the job's result. fn says how the attempt ended as
// a Handler does: nil, or jobs.Permanent, jobs.RetryAfter, jobs.Snooze,
// jobs.InvalidOutput, jobs.NeedsReview (see Handler). When fn returns an
// error its result is ignored.
func Handle[A, R any](kind jobs.Kind[A, R], fn func(ctx context.Context, job *jobs.Job, args A) (R, error)) KindHandler {
	return KindHandler{Kind: kind.Name(), Handler: HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		args, err := kind.Args(job)
		if err != nil {
			return nil, err
		}
		r, err := fn(ctx, job, args)
		if err != nil {
			return nil, err
		}
		result, err := kind.EncodeResult(r)
		if err != nil {
			return nil, jobs.Permanent(err) // the same result would fail to encode on every retry
		}
		return result, nil
	})}
}

// Kinds builds Config.Handlers from typed registrations:
//
//	lease.Config{Handlers: lease.Kinds(lease.Handle(Extract, extract))}
//
// A kind registered twice panics: it is a program error, found at start-up
// like http.ServeMux's duplicate pattern.
func Kinds(handlers ...KindHandler) map[string]Handler {
	m := make(map[string]Handler, len(handlers))
	for _, h := range handlers {
		if _, dup := m[h.Kind]; dup {
			panic(fmt.Sprintf("lease: kind %q registered twice", h.Kind))
		}
		m[h.Kind] = h.Handler
	}
	return m
}

// Start runs r.Run(ctx) in a goroutine of its own and returns the function
// that stops it: stop cancels the run, waits for the graceful shutdown Run
// describes, and returns Run's error (nil after a clean shutdown). Call
// stop exactly once; a host with its own lifecycle calls Run instead.
func (r *Runner) Start(ctx context.Context) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}
