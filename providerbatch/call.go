package providerbatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// Codec is a provider API's request and answer types as JSON: what a
// batch line holds and what comes back in a batch's results. The adapters
// provide one per API (provider/openai.Chat for chat completions).
type Codec[Req, Resp any] interface {
	// Provider is the name of the provider whose API this is; a Submitter
	// takes only calls whose provider is its own.
	Provider() string
	// Model is the model req names; a batch holds one model's requests.
	Model(req Req) string
	// Encode is req's JSON body.
	Encode(req Req) (json.RawMessage, error)
	// Decode reads an answer's JSON body.
	Decode(body json.RawMessage) (Resp, error)
	// Usage is the usage an answer reports.
	Usage(resp Resp) jobs.Usage
}

// Call is one kind's provider call, written once and served by either
// path: a synchronous attempt (Handle, for a lease.Runner) or a provider
// batch (Batch, for a Submitter). build makes the provider request from
// the job's arguments; parse validates the answer and makes the job's
// result, returning the jobs package's errors (jobs.InvalidOutput,
// jobs.NeedsReview, jobs.Permanent) exactly as a handler would: both paths
// decide the job's outcome from them the same way. Both get the job as
// lease.Handle's handlers do, for its tenant and id; on the batch path its
// Attempt and Fence are those of the batch request.
type Call[A, R, Req, Resp any] struct {
	kind  jobs.Kind[A, R]
	codec Codec[Req, Resp]
	build func(ctx context.Context, job *jobs.Job, args A) (Req, error)
	parse func(ctx context.Context, job *jobs.Job, args A, answer Resp) (R, error)
}

// NewCall declares kind's provider call. Declare it once, beside the kind:
//
//	var extractCall = providerbatch.NewCall(Extract, openai.Chat{}, buildExtract, parseExtract)
func NewCall[A, R, Req, Resp any](kind jobs.Kind[A, R], codec Codec[Req, Resp],
	build func(ctx context.Context, job *jobs.Job, args A) (Req, error),
	parse func(ctx context.Context, job *jobs.Job, args A, answer Resp) (R, error)) *Call[A, R, Req, Resp] {
	return &Call[A, R, Req, Resp]{kind: kind, codec: codec, build: build, parse: parse}
}

// Kind is the call's kind.
func (c *Call[A, R, Req, Resp]) Kind() jobs.Kind[A, R] { return c.kind }

// Handle is the synchronous path: a typed handler for a lease.Runner that
// builds the request, makes it with do (the provider's SDK, through the
// adapter's Options so admission and usage see it) and parses the answer.
// A request that could not be built was not sent (lease.NotSent): its
// admission permit is given back whole.
func (c *Call[A, R, Req, Resp]) Handle(do func(ctx context.Context, req Req) (Resp, error)) lease.KindHandler {
	return lease.Handle(c.kind, func(ctx context.Context, job *jobs.Job, args A) (R, error) {
		var zero R
		req, err := c.build(ctx, job, args)
		if err != nil {
			return zero, lease.NotSent(fmt.Errorf("building the request of kind %q: %w", c.kind.Name(), err))
		}
		resp, err := do(ctx, req)
		if err != nil {
			return zero, err
		}
		return c.parse(ctx, job, args, resp)
	})
}

// Batch is the batch path: the call as a Submitter's Config.Calls takes it.
func (c *Call[A, R, Req, Resp]) Batch() KindCall {
	return KindCall{kind: c.kind.Name(), provider: c.codec.Provider(), batched: batched(c)}
}

// KindCall is one kind's call with its types erased, for Config.Calls.
type KindCall struct {
	kind, provider string
	batched        batchedCall
}

// Kind is the name of the call's kind.
func (k KindCall) Kind() string { return k.kind }

// batchedCall is what the Submitter needs of a call.
type batchedCall interface {
	// request builds job's request: its model, body and an estimate of
	// its input tokens.
	request(ctx context.Context, job *jobs.Job) (model string, body json.RawMessage, err error)
	// answer parses job's answer into its encoded result, or the error a
	// handler would have returned, and reports the answer's usage.
	answer(ctx context.Context, job *jobs.Job, body json.RawMessage) (json.RawMessage, jobs.Usage, error)
	// usage is the usage an answer reports, zero when it cannot be read.
	usage(body json.RawMessage) jobs.Usage
}

type batchedFunc[A, R, Req, Resp any] struct{ c *Call[A, R, Req, Resp] }

func batched[A, R, Req, Resp any](c *Call[A, R, Req, Resp]) batchedCall {
	return batchedFunc[A, R, Req, Resp]{c: c}
}

func (b batchedFunc[A, R, Req, Resp]) request(ctx context.Context, job *jobs.Job) (string, json.RawMessage, error) {
	args, err := b.c.kind.Args(job)
	if err != nil {
		return "", nil, err
	}
	req, err := b.c.build(ctx, job, args)
	if err != nil {
		return "", nil, fmt.Errorf("building the request of kind %q: %w", b.c.kind.Name(), err)
	}
	body, err := b.c.codec.Encode(req)
	if err != nil {
		return "", nil, jobs.Permanent(fmt.Errorf("encoding the request of kind %q: %w", b.c.kind.Name(), err))
	}
	return b.c.codec.Model(req), body, nil
}

func (b batchedFunc[A, R, Req, Resp]) answer(ctx context.Context, job *jobs.Job, body json.RawMessage) (json.RawMessage, jobs.Usage, error) {
	args, err := b.c.kind.Args(job)
	if err != nil {
		return nil, jobs.Usage{}, err
	}
	resp, err := b.c.codec.Decode(body)
	if err != nil {
		// The provider answered, and was paid, but not in its API's shape:
		// the model's output is what the job shows.
		return nil, jobs.Usage{}, jobs.InvalidOutput(fmt.Errorf("the answer is not a %s answer: %w", b.c.codec.Provider(), err), body)
	}
	usage := b.c.codec.Usage(resp)
	r, err := b.c.parse(ctx, job, args, resp)
	if err != nil {
		return nil, usage, err
	}
	result, err := b.c.kind.EncodeResult(r)
	if err != nil {
		return nil, usage, jobs.Permanent(err)
	}
	return result, usage, nil
}

func (b batchedFunc[A, R, Req, Resp]) usage(body json.RawMessage) jobs.Usage {
	resp, err := b.c.codec.Decode(body)
	if err != nil {
		return jobs.Usage{}
	}
	return b.c.codec.Usage(resp)
}

// errNoCall is returned for a job whose kind has no call in Config.Calls.
var errNoCall = errors.New("providerbatch: no call for the job's kind")
