// Package adapt is what the provider adapters share: the HTTP middleware
// that watches each SDK call and the classification of how it ended. The
// SDK packages give it their API error type and usage fields.
package adapt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// Dialect is what differs between SDKs.
type Dialect struct {
	// Name names the provider in errors ("openai").
	Name string
	// APIError returns the status and headers of an error the SDK made of
	// an HTTP answer.
	APIError func(err error) (status int, header http.Header, ok bool)
	// Usage reads the usage an answer's JSON body reports.
	Usage func(body []byte) (jobs.Usage, bool)
	// ContextWindow reports an API error that refuses a request longer
	// than the model's context window.
	ContextWindow func(err error) bool
}

// Observer receives the responses of calls made outside an admitted
// attempt; nil Limiter means none.
type Observer struct {
	Limiter admission.Limiter
	Pool    string
}

// record is what the middleware saw of the requests of one Call.
type record struct {
	mu       sync.Mutex
	seen     bool // the middleware saw a request of this Call
	sent     bool // one of them may have reached the provider
	answered bool // one was answered 2xx and its body read in full
}

type recordKey struct{}

// Middleware watches every request of an SDK client: it tells admission
// what each response says (lease.Responded inside an admitted attempt,
// admission.Observe on Observer outside one), records the usage a
// successful answer reports (lease.RecordUsage), and notes whether a
// failed request can have reached the provider.
type Middleware struct {
	Dialect  Dialect
	Observer Observer
}

// Handle is the SDK middleware (option.WithMiddleware).
func (m *Middleware) Handle(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	ctx := req.Context()
	rec, _ := ctx.Value(recordKey{}).(*record)
	if rec == nil {
		rec = &record{} // outside Call: what it notes is not read
	}
	rec.markSeen()
	if err := ctx.Err(); err != nil {
		return nil, err // never passed on: not sent
	}
	var gotConn, wroteHeaders atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn:      func(string) { gotConn.Store(true) },
		WroteHeaders: func() { wroteHeaders.Store(true) },
	}))
	resp, err := next(req)
	if err != nil {
		if !neverSent(err, gotConn.Load(), wroteHeaders.Load()) {
			rec.markSent(false)
		}
		return nil, err
	}
	rec.markSent(false)
	if resp.StatusCode/100 == 2 && !isEventStream(resp.Header) && !isDownload(resp.Header) {
		// Read the answer before reporting it: a body lost on the way
		// leaves the call uncertain, not answered. A stream, or a file
		// (a batch's results, which may run to hundreds of megabytes and
		// hold no usage of their own), is the caller's to read, as it
		// comes.
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s answer: %w", m.Dialect.Name, err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if u, ok := m.Dialect.Usage(body); ok {
			lease.RecordUsage(ctx, u)
		}
		rec.markSent(true)
	}
	observe(ctx, m.Observer, resp)
	return resp, nil
}

func (r *record) markSeen() {
	r.mu.Lock()
	r.seen = true
	r.mu.Unlock()
}

func (r *record) markSent(answered bool) {
	r.mu.Lock()
	r.sent = true
	r.answered = r.answered || answered
	r.mu.Unlock()
}

// observe passes a response's status and headers to admission.
func observe(ctx context.Context, obs Observer, resp *http.Response) {
	if lease.PermitOf(ctx) != nil {
		lease.Responded(ctx, resp.StatusCode, resp.Header)
		return
	}
	if obs.Limiter != nil {
		// Best effort, as lease.Responded: a limiter that cannot be told
		// meets the provider's own refusal again on its next call.
		_, _ = admission.Observe(ctx, obs.Limiter, obs.Pool, resp.StatusCode, resp.Header)
	}
}

// neverSent reports whether a transport error proves that no byte of the
// request's headers reached the provider. With net/http's transport the
// trace says so exactly: it asked for a connection and never finished
// writing the headers. A transport that does not trace (GetConn never
// called) is believed only for a failed dial or name lookup.
func neverSent(err error, gotConn, wroteHeaders bool) bool {
	if wroteHeaders {
		return false
	}
	if gotConn {
		return true
	}
	var op *net.OpError
	var dns *net.DNSError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &dns)
}

func isEventStream(h http.Header) bool {
	mediaType, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mediaType == "text/event-stream"
}

// isDownload reports a file's content rather than an API answer: what
// OpenAI's Files content and Anthropic's batch results are served as.
func isDownload(h http.Header) bool {
	mediaType, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return false
	}
	switch mediaType {
	case "application/octet-stream", "application/jsonl", "application/x-jsonl", "application/x-ndjson":
		return true
	}
	return false
}

// Call runs fn, the SDK calls of one provider call, and classifies the
// error it returns (see Classify).
func Call[T any](ctx context.Context, d Dialect, fn func(ctx context.Context) (T, error)) (T, error) {
	rec := &record{}
	v, err := fn(context.WithValue(ctx, recordKey{}, rec))
	if err != nil {
		return v, classify(ctx, d, rec, err)
	}
	return v, nil
}

// classify turns an SDK error into the error that tells the lease runner
// how the attempt ended, and marks the attempt's usage uncertain where the
// call may have been billed without its answer in hand.
func classify(ctx context.Context, d Dialect, rec *record, err error) error {
	rec.mu.Lock()
	seen, sent, answered := rec.seen, rec.sent, rec.answered
	rec.mu.Unlock()
	uncertain := func() { lease.RecordUsage(ctx, jobs.Usage{Uncertain: true}) }
	if status, header, ok := d.APIError(err); ok {
		switch {
		case status == http.StatusTooManyRequests:
			uncertain()
			if wait := admission.ParseSignal(status, header, time.Now()).Cooldown; wait > 0 {
				return &jobs.SnoozeError{After: wait, Reason: fmt.Sprintf("%s 429: %v", d.Name, err)}
			}
			return err
		case status == http.StatusRequestTimeout || status == http.StatusConflict || status >= 500:
			uncertain()
			return jobs.RetryAfterHeader(err, header.Get("Retry-After"))
		case status >= 400 && d.ContextWindow != nil && d.ContextWindow(err):
			// Permanent for this model; a route may move the attempt to a
			// model with a larger window (lease.FailureContextWindow).
			return jobs.Permanent(fmt.Errorf("%w: %w", lease.ErrContextWindow, err))
		case status >= 400:
			return jobs.Permanent(err)
		}
		return err
	}
	switch {
	case !seen:
		// The middleware saw no request of this Call: the client was
		// built without Options, or fn did not pass on the context Call
		// gave it. Nothing shows the call was not sent, so it may have
		// been billed: never refund what may have been paid.
		uncertain()
		return err
	case !sent:
		// No request was passed on (the SDK failed to build it, the
		// context was over), or each failed before its headers were
		// written. The SDK may return the context's error in place of
		// the transport's: the record, not the error, says which.
		return lease.NotSent(err)
	case answered:
		// The provider answered 2xx, its usage is recorded, and the SDK
		// could not read the answer: output as invalid as a model's
		// malformed JSON, retried within the invalid-output budget.
		return jobs.InvalidOutput(err, nil)
	}
	uncertain()
	return err
}

// Tokens adds token counts as a provider reports them: negatives count as
// zero and the sum saturates rather than wrapping.
func Tokens(counts ...int64) int64 {
	var sum int64
	for _, n := range counts {
		if n <= 0 {
			continue
		}
		if sum > math.MaxInt64-n {
			return math.MaxInt64
		}
		sum += n
	}
	return sum
}
