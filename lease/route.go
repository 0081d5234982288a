package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
)

// Failure names a way a candidate's call can fail that a Route may move
// on for: the next candidate gets the same attempt at once.
type Failure string

// The failures a route can move on for. The runner reads them from how the
// call ended (lease.Responded's status, NotSent, the adapter's errors), not
// from the handler's own judgement.
const (
	// FailureRateLimited: the provider answered 429.
	FailureRateLimited Failure = "rate_limited"
	// FailureServerError: the provider answered 5xx, 408 or 409.
	FailureServerError Failure = "server_error"
	// FailureTimeout: the call was sent and no answer came (a timeout, a
	// connection lost after sending). It may have been billed: its usage
	// is marked uncertain before the attempt moves on.
	FailureTimeout Failure = "timeout"
	// FailureUnreachable: the call never reached the provider (a refused
	// or failed dial, a name that does not resolve).
	FailureUnreachable Failure = "unreachable"
	// FailureContextWindow: the request is longer than the model's
	// context window (an error matching ErrContextWindow): a candidate
	// with a larger window may serve it.
	FailureContextWindow Failure = "context_window"
)

// DefaultMoveOn is what a Route with no MoveOn moves on for: every
// failure of the provider's rather than of the request's. Invalid output,
// a content refusal, a 400 for the request itself and the handler's own
// errors never move an attempt: another model would be asked the same
// thing, and paid for it, for an answer the job's policy decides on.
var DefaultMoveOn = []Failure{FailureRateLimited, FailureServerError, FailureTimeout, FailureUnreachable, FailureContextWindow}

// ErrContextWindow is matched by the error of a call refused because its
// request exceeds the model's context window. The provider adapters
// (provider/openai, provider/anthropic) wrap such refusals with it.
var ErrContextWindow = errors.New("request exceeds the model's context window")

// Adapter reaches one candidate's provider: provider/openai's and
// provider/anthropic's *Client, or a host's own client. A handler that
// serves several candidates switches on its concrete type.
type Adapter interface {
	// Provider names the provider's API ("openai", "anthropic").
	Provider() string
}

// Candidate is one way to serve the calls of a route: an admission pool, the
// model to ask for and the client of its provider.
type Candidate struct {
	// Name identifies the candidate in attempts, metrics and the console.
	// Default: Pool.
	Name string
	// Pool is the admission pool of the candidate's calls. It must exist
	// in the limiter. A pool has one price (admission.Pool), so every
	// candidate naming a pool names the same model: the usage ledger's
	// pool is then the model that served.
	Pool string
	// Model is the model the handler asks the provider for. Required.
	Model string
	// Adapter is the provider's client. Required.
	Adapter Adapter
}

// Route lists the candidates an attempt of a kind may use, in order of
// preference (Admission.Routes). An attempt takes the first candidate
// whose pool can grant a permit within Admission.MaxWait, and moves on to
// the next when a call fails in a way MoveOn names; with no candidate
// left, the job is snoozed for the soonest wait, as an attempt without a
// route is. Moving stays inside the attempt: it never takes another
// attempt from the retry budget nor runs past the attempt's deadline, and
// every call it makes holds its own permit, is settled with its own usage
// and is recorded on the attempt (jobs.Attempt.Moves).
type Route struct {
	// Candidates, in order of preference. At least one; names unique.
	Candidates []Candidate
	// Pin, when set, names the one candidate every attempt uses, with no
	// fallback: for results that must come from one model.
	Pin string
	// MoveOn lists the failures that move an attempt to the next
	// candidate. Default DefaultMoveOn.
	MoveOn []Failure
}

// Limits on routes.
const (
	// MaxCandidates is the most candidates a route may list.
	MaxCandidates = 8
	// MaxModelLen bounds a candidate's model and name.
	MaxModelLen = jobs.MaxCandidateLen
)

// candidateKey finds the candidate serving a call in its context.
type candidateKey struct{}

// CandidateOf returns the route candidate whose call the context ctx
// belongs to: inside a routed attempt's handler, the candidate it must
// call (its Model, through its Adapter). ok is false outside a route.
func CandidateOf(ctx context.Context) (Candidate, bool) {
	c, ok := ctx.Value(candidateKey{}).(*Candidate)
	if !ok {
		return Candidate{}, false
	}
	return *c, true
}

// withDefaults validates r, the route of kind, and fills in its defaults.
func (r Route) withDefaults(kind string) (Route, error) {
	fail := func(format string, args ...any) (Route, error) {
		return Route{}, fmt.Errorf("Admission.Routes[%q]: "+format, append([]any{kind}, args...)...)
	}
	switch {
	case len(r.Candidates) == 0:
		return fail("no candidates")
	case len(r.Candidates) > MaxCandidates:
		return fail("%d candidates; at most %d", len(r.Candidates), MaxCandidates)
	}
	out := Route{Pin: r.Pin, MoveOn: slices.Clone(r.MoveOn), Candidates: make([]Candidate, len(r.Candidates))}
	if len(out.MoveOn) == 0 {
		out.MoveOn = slices.Clone(DefaultMoveOn)
	}
	for _, f := range out.MoveOn {
		if !slices.Contains(DefaultMoveOn, f) {
			return fail("MoveOn: %q is not a Failure", f)
		}
	}
	for i, c := range r.Candidates {
		if c.Name == "" {
			c.Name = c.Pool
		}
		field := fmt.Sprintf("Candidates[%d]", i)
		if p := validate.Text(c.Pool, true, admission.MaxPoolLen); p != "" {
			return fail("%s.Pool %s", field, p)
		}
		if p := validate.Text(c.Model, true, MaxModelLen); p != "" {
			return fail("%s (%q).Model %s", field, c.Name, p)
		}
		if p := validate.Text(c.Name, true, MaxModelLen); p != "" {
			return fail("%s.Name %s", field, p)
		}
		if c.Adapter == nil {
			return fail("%s (%q) has no Adapter", field, c.Name)
		}
		if slices.ContainsFunc(out.Candidates[:i], func(o Candidate) bool { return o.Name == c.Name }) {
			return fail("%s: the name %q is used twice", field, c.Name)
		}
		out.Candidates[i] = c
	}
	if r.Pin != "" && !slices.ContainsFunc(out.Candidates, func(c Candidate) bool { return c.Name == r.Pin }) {
		return fail("Pin %q names no candidate", r.Pin)
	}
	return out, nil
}

// tried is the candidates an attempt may use, in order.
func (r Route) tried() []Candidate {
	if r.Pin == "" {
		return r.Candidates
	}
	i := slices.IndexFunc(r.Candidates, func(c Candidate) bool { return c.Name == r.Pin })
	return r.Candidates[i : i+1]
}

// validateRoutes checks the routes together: each pool serves one model.
func validateRoutes(routes map[string]Route) error {
	models := map[string]string{}
	for _, kind := range sortedKeys(routes) {
		for _, c := range routes[kind].Candidates {
			if m, ok := models[c.Pool]; ok && m != c.Model {
				return fmt.Errorf("Admission.Routes[%q]: candidate %q: pool %q serves model %q in another candidate; a pool has one price, so it serves one model", kind, c.Name, c.Pool, m)
			}
			models[c.Pool] = c.Model
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkPools asks the limiter about every candidate's pool and refuses one
// it does not know (Run, before its first claim). A limiter that cannot answer now is not held against
// the routes: the attempts meet it.
func (a *Admission) checkPools(ctx context.Context) error {
	for _, kind := range sortedKeys(a.Routes) {
		for _, c := range a.Routes[kind].Candidates {
			if err := a.Limiter.Ready(ctx, c.Pool, 0); errors.Is(err, admission.ErrUnknownPool) {
				return fmt.Errorf("Admission.Routes[%q]: candidate %q: pool %q does not exist: %w", kind, c.Name, c.Pool, err)
			}
		}
	}
	return nil
}

// routeKey finds an attempt's route record in its context.
type routeKey struct{}

// routeRecord is what a routed attempt's calls leave for its completion:
// the candidate that made the last call and the calls that moved on.
type routeRecord struct {
	mu        sync.Mutex
	candidate Candidate
	moves     []jobs.Move
}

func (r *routeRecord) served(c Candidate) {
	r.mu.Lock()
	r.candidate = c
	r.mu.Unlock()
}

func (r *routeRecord) moved(m jobs.Move) {
	r.mu.Lock()
	r.moves = append(r.moves, m)
	r.mu.Unlock()
}

// fill writes the record into the attempt's completion.
func (r *routeRecord) fill(c *jobs.Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// An attempt that moved on and then found no candidate with a permit
	// has moves and no candidate.
	c.Candidate, c.Model, c.Moves = r.candidate.Name, r.candidate.Model, r.moves
}

// routed runs a handler on the candidates of its kind's route.
type routed struct {
	next  Handler
	a     *Admission
	route Route
}

func (h *routed) Work(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
	rec, _ := ctx.Value(routeKey{}).(*routeRecord)
	if rec == nil {
		rec = &routeRecord{} // a handler run outside the runner's attempts
	}
	req := h.a.request(job)
	candidates := h.route.tried()
	var passed error // the soonest snooze of the candidates passed over
	for i := range candidates {
		cand := &candidates[i]
		last := i == len(candidates)-1
		req.Pool = cand.Pool
		permit, err := h.a.acquire(ctx, req)
		if err != nil {
			h.a.countCall(ctx, job.Kind, cand.Name, "passed")
			if last || ctx.Err() != nil {
				return nil, sooner(passed, err)
			}
			passed = sooner(passed, err)
			continue
		}
		callCtx := context.WithValue(ctx, candidateKey{}, cand)
		result, report, err := h.a.callUnder(callCtx, permit, req, func(ctx context.Context) (json.RawMessage, error) {
			return h.next.Work(ctx, job)
		})
		failure := report.failure(err)
		if err == nil || last || failure == "" || !slices.Contains(h.route.MoveOn, failure) || !timeLeft(ctx, job) {
			rec.served(*cand)
			h.a.countCall(ctx, job.Kind, cand.Name, outcomeLabel(err, failure))
			err = report.snoozeFor429(err, req.Pool)
			if passed != nil && errors.As(err, new(*jobs.SnoozeError)) {
				err = sooner(passed, err) // an earlier candidate may be ready first
			}
			return result, err
		}
		h.a.countCall(ctx, job.Kind, cand.Name, "moved_"+string(failure))
		if snooze := report.snoozeFor429(nil, req.Pool); snooze != nil {
			// Should no later candidate grant, the job waits out this
			// candidate's cooldown at most.
			passed = sooner(passed, snooze)
		}
		rec.moved(jobs.Move{
			Candidate: cand.Name, Model: cand.Model, Failure: string(failure), Error: err.Error(),
			InputTokens: report.usage.InputTokens, OutputTokens: report.usage.OutputTokens, Uncertain: report.usage.Uncertain,
		})
	}
	panic("unreachable: the last candidate returns")
}

// timeLeft reports whether a move may start: the attempt's context is
// live and the job's deadline, if it has one, has not passed.
func timeLeft(ctx context.Context, job *jobs.Job) bool {
	return ctx.Err() == nil && (job.DeadlineAt.IsZero() || time.Now().Before(job.DeadlineAt))
}

// sooner keeps the error that lets the job run soonest: of two snoozes,
// the shorter; a snooze before any other error (a candidate too small
// for the request, say), which is returned only if no candidate will
// ever serve.
func sooner(kept, err error) error {
	var a, b *jobs.SnoozeError
	switch {
	case kept == nil:
		return err
	case !errors.As(err, &b):
		return kept
	case !errors.As(kept, &a) || b.After < a.After:
		return err
	}
	return kept
}

func outcomeLabel(err error, failure Failure) string {
	switch {
	case err == nil:
		return "served"
	case failure != "":
		return "failed_" + string(failure)
	}
	return "failed"
}

// countCall counts one candidate's part in an attempt: served, failed, moved
// on from, or passed over for want of a permit.
func (a *Admission) countCall(ctx context.Context, kind, candidate, result string) {
	if c := a.obs.routeCalls; c.Enabled(ctx) {
		c.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", kind),
			attribute.String("candidate", candidate), attribute.String("result", result)))
	}
}

// callReport is what the runner saw of one call made under a permit.
type callReport struct {
	responded bool
	status    int
	cooldown  time.Duration
	outcome   admission.CallResult
	usage     jobs.Usage
}

// failure classifies a failed call for its route; "" for a failure no
// route moves on for.
func (r callReport) failure(err error) Failure {
	switch {
	case err == nil:
		return ""
	case r.responded && r.status == http.StatusTooManyRequests:
		return FailureRateLimited
	case r.responded && (r.status >= 500 || r.status == http.StatusRequestTimeout || r.status == http.StatusConflict):
		return FailureServerError
	case errors.Is(err, ErrContextWindow):
		return FailureContextWindow
	case r.responded:
		return ""
	case r.outcome == admission.CallNotSent && unreachable(err):
		return FailureUnreachable
	case r.outcome == admission.CallUncertain && !errors.As(err, new(*jobs.InvalidOutputError)):
		return FailureTimeout
	}
	return ""
}

// unreachable reports a transport error that shows the provider could not
// be reached: a failed dial or name lookup.
func unreachable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &dns)
}

// snoozeFor429 turns a 429 that gave a wait into a snooze of the job, as
// an attempt without a route does, whatever the handler returned.
func (r callReport) snoozeFor429(err error, pool string) error {
	if r.responded && r.status == http.StatusTooManyRequests && r.cooldown > 0 {
		return &jobs.SnoozeError{After: r.cooldown, Reason: fmt.Sprintf("provider 429 on pool %q", pool)}
	}
	return err
}

// request is the admission request of job's attempt under a route: the
// Route function's (tenant and tokens), or the job's tenant and estimated
// tokens without one. The pool is the candidate's.
func (a *Admission) request(job *jobs.Job) admission.Request {
	if a.Route != nil {
		if req, ok := a.Route(job); ok {
			return req
		}
	}
	return admission.Request{Tenant: job.Tenant, Tokens: job.EstimatedTokens}
}
