package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/jobs"
)

// Defaults of a zero Admission.
const (
	DefaultAdmissionMaxWait     = time.Second
	DefaultAdmissionUnavailable = 5 * time.Second
	admissionReleaseTimeout     = 5 * time.Second
	maxGateSleep                = 5 * time.Second
)

// Admission puts a runner's provider calls under an admission limiter
// (Config.Admission). Every handler of a kind that Route maps to a pool runs
// only while holding a permit of that pool:
//
//   - Before a claim, the runner asks the limiter whether the queue's pools
//     (QueuePools) could grant within MaxWait, and does not claim while none
//     can: work is claimed only when a permit can be had soon.
//   - After the claim, the permit is acquired before the handler runs. A
//     wait up to MaxWait is sat out holding the lease; a longer one, or an
//     unreachable limiter, snoozes the job (jobs.Snooze): it goes back to
//     wait and the attempt is not counted against its retry budget.
//   - The handler reports the provider's answer with Responded (status and
//     headers) and its usage with RecordUsage. The permit is released with
//     that: answered (refund of unused tokens), uncertain (a 5xx, a 429, a
//     timeout, an error after sending: nothing refunded, the attempt marked
//     uncertain) or, for an error wrapped with NotSent, a full refund.
//   - A provider 429 sets the pool's cooldown for every process (from
//     Retry-After, retry-after-ms or rate-limit headers). If the response
//     gave a wait, the job is snoozed for it and the attempt is not counted,
//     whatever the handler returned; the job's deadline still bounds it. A
//     429 with no wait at all is an ordinary transient failure and counts,
//     so a provider that refuses without saying when cannot loop a job
//     forever.
//
// A request larger than its pool's burst can never run, nor can one Route
// built wrongly (ErrInvalid): the job fails at once (jobs.Permanent). The
// limiter's permit TTL (admission.Config.PermitTTL) must exceed the
// runner's AttemptTimeout, or a slow call's slot is counted free early.
//
// Turn off the provider SDK's own retries (openai-go:
// option.WithMaxRetries(0)): llmq owns retries, and an SDK retry would make
// a second call under one permit, unseen by the limiter and the attempt
// history.
type Admission struct {
	// Limiter grants permits; usually an *admission.Postgres. Required.
	Limiter admission.Limiter
	// Route maps a job to the request it makes: pool, tenant and tokens to
	// reserve (for example prompt size plus max_tokens, or
	// job.EstimatedTokens). ok false runs the job without a permit.
	// Required unless Routes names every admitted kind.
	Route func(job *jobs.Job) (req admission.Request, ok bool)
	// Routes maps a kind to the candidates its attempts may use, in order
	// (see Route): each attempt takes the first candidate whose pool can
	// grant within MaxWait and moves on to the next for the failures the
	// route names. The request of a routed attempt is Route's with the
	// candidate's pool, or, with Route nil or ok false, the job's tenant
	// and EstimatedTokens. Every kind must have a handler and a pool
	// serves one model across all routes (NewRunner checks both); every
	// candidate's pool must exist in Limiter (Run asks it before its
	// first claim).
	Routes map[string]Route
	// QueuePools names the pools each queue's jobs draw from; the runner
	// claims from a queue only while one of them could grant within
	// MaxWait. A queue not listed is claimed from as usual. List every
	// candidate pool of a routed kind's queue: a queue whose first pool
	// cools down is still claimed from while another can grant.
	QueuePools map[string][]string
	// MaxWait is the longest an attempt waits for a permit while holding
	// its lease. Default 1s; it must be shorter than the attempt timeout.
	MaxWait time.Duration
	// UnavailableSnooze is how long a job is put off when the limiter is
	// unreachable and its failure policy admits nothing. Default 5s.
	UnavailableSnooze time.Duration

	obs *instruments // the runner's, for the wait histogram
}

func (a *Admission) withDefaults(attemptTimeout time.Duration) (*Admission, error) {
	switch {
	case a.Limiter == nil:
		return nil, errors.New("Admission.Limiter is nil")
	case a.Route == nil && len(a.Routes) == 0:
		return nil, errors.New("Admission.Route is nil and there are no Routes")
	case a.MaxWait < 0 || a.UnavailableSnooze < 0:
		return nil, errors.New("Admission.MaxWait and UnavailableSnooze must not be negative")
	}
	c := *a
	c.MaxWait = cmp.Or(c.MaxWait, DefaultAdmissionMaxWait)
	c.UnavailableSnooze = cmp.Or(c.UnavailableSnooze, DefaultAdmissionUnavailable)
	if c.MaxWait >= attemptTimeout {
		return nil, fmt.Errorf("Admission.MaxWait (%s) must be shorter than AttemptTimeout (%s)", c.MaxWait, attemptTimeout)
	}
	c.Routes = make(map[string]Route, len(a.Routes))
	for kind, route := range a.Routes {
		r, err := route.withDefaults(kind)
		if err != nil {
			return nil, err
		}
		c.Routes[kind] = r
	}
	if err := validateRoutes(c.Routes); err != nil {
		return nil, err
	}
	return &c, nil
}

// wrap puts every handler under admission.
func (a *Admission) wrap(handlers map[string]Handler) map[string]Handler {
	wrapped := make(map[string]Handler, len(handlers))
	for kind, h := range handlers {
		if route, ok := a.Routes[kind]; ok {
			wrapped[kind] = &routed{next: h, a: a, route: route}
			continue
		}
		wrapped[kind] = &admitted{next: h, a: a}
	}
	return wrapped
}

// gate reports how long the producer of queue should wait before claiming:
// zero when one of its pools can grant now, or within MaxWait by a refill
// or a cooldown's end (or no pool is listed, or the limiter cannot say: the
// attempt's own acquire decides then). A pool whose in-flight slots are all
// held is not claimed for: when one frees is unpredictable, and claiming
// would hold a lease while waiting for it.
func (a *Admission) gate(ctx context.Context, queue string) time.Duration {
	pools := a.QueuePools[queue]
	if len(pools) == 0 {
		return 0
	}
	soonest := time.Duration(-1)
	for _, pool := range pools {
		err := a.Limiter.Ready(ctx, pool, 0)
		var w *admission.WaitError
		switch {
		case err == nil:
			return 0
		case !errors.As(err, &w):
			return 0
		case w.Reason != admission.ReasonInFlight && w.RetryAfter <= a.MaxWait:
			return 0
		}
		if soonest < 0 || w.RetryAfter < soonest {
			soonest = w.RetryAfter
		}
	}
	return min(max(soonest, time.Millisecond), maxGateSleep)
}

// flusher is a limiter that queues releases in the process and can wait
// for them: *admission.Postgres.
type flusher interface {
	Flush(ctx context.Context) error
}

// flush waits, within admissionReleaseTimeout, until the limiter has been
// through every release and give-back this process queued. An acquire the
// shutdown cancelled after a cycle took it is granted and given back in a
// later cycle, and a release whose cycle failed is retried in the
// background: a process that exits before they ran leaves their slots
// held until the permits expire (PermitTTL, longer than any attempt).
func (a *Admission) flush(ctx context.Context, logger *slog.Logger) {
	f, ok := a.Limiter.(flusher)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), admissionReleaseTimeout)
	defer cancel()
	if err := f.Flush(ctx); err != nil {
		logger.Warn("llmq: admission releases still queued at shutdown; their permits hold their slots until they expire", "err", err)
	}
}

// admitted runs a handler under a permit.
type admitted struct {
	next Handler
	a    *Admission
}

// callKey finds the attempt's call record in its context.
type callKey struct{}

type call struct {
	limiter   admission.Limiter
	permit    *admission.Permit
	mu        sync.Mutex
	pool      string
	responded bool
	status    int
	signal    admission.Signal
}

// Responded tells the runner how the provider answered the attempt's call:
// its status and headers. Under Config.Admission it applies the provider's
// cooldown and remaining budget to the pool at once, for every process,
// and decides how the permit is settled. Call it for every response,
// before reading the body. Outside an admitted attempt it does nothing.
func Responded(ctx context.Context, status int, header http.Header) {
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return
	}
	signal := admission.ParseSignal(status, header, time.Now())
	c.mu.Lock()
	c.responded, c.status, c.signal = true, status, signal
	c.mu.Unlock()
	// Best effort: if the limiter cannot be told, the permit still settles
	// as uncertain and this process's next acquire meets the provider's
	// own refusal again.
	if signal.Cooldown > 0 {
		_ = c.limiter.Cooldown(ctx, c.pool, signal.Cooldown)
	}
	_ = c.limiter.LowerRemaining(ctx, c.pool, signal.Remaining)
}

// PermitOf returns the admission permit the attempt whose context ctx is
// holds, or nil outside an admitted attempt. Handlers read its Tokens (to
// set max_tokens within the reservation) or its grant time; they must not
// release it: the runner does.
func PermitOf(ctx context.Context) *admission.Permit {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		return c.permit
	}
	return nil
}

// notSentError marks a handler error that happened before any provider
// call was sent.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// NotSent wraps a handler's error to say no provider call was sent (the
// request could not be built, a document could not be read): the permit
// is refunded in full. The error is otherwise handled as it would be
// unwrapped.
func NotSent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err: err}
}

func (h *admitted) Work(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
	if h.a.Route == nil {
		return h.next.Work(ctx, job)
	}
	req, ok := h.a.Route(job)
	if !ok {
		return h.next.Work(ctx, job)
	}
	return h.a.underPermit(ctx, req, func(ctx context.Context) (json.RawMessage, error) {
		return h.next.Work(ctx, job)
	})
}

// underPermit runs work holding a permit for req: an attempt's handler,
// or a step with its own request (StepConfig.Admission). The permit is
// settled by how far work's call got (see outcome), from the usage work
// recorded. A 429 that gave a wait snoozes the job for it.
func (a *Admission) underPermit(ctx context.Context, req admission.Request, work func(ctx context.Context) (json.RawMessage, error)) (json.RawMessage, error) {
	permit, err := a.acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	result, report, err := a.callUnder(ctx, permit, req, work)
	return result, report.snoozeFor429(err, req.Pool)
}

// callUnder runs work, one provider call, holding permit, and settles the
// permit by how far the call got, with the usage work recorded (its own:
// a routed attempt's earlier calls settled theirs). It reports what it saw
// of the call.
func (a *Admission) callUnder(ctx context.Context, permit *admission.Permit, req admission.Request,
	work func(ctx context.Context) (json.RawMessage, error)) (json.RawMessage, callReport, error) {
	// The attempt's context may be over (timeout, lost lease) when the
	// permit is settled: settle it regardless, within a bound of its own.
	// An unreleased permit would expire on its own, so an error here only
	// delays its slot.
	release := func(o admission.CallOutcome) {
		settle, cancel := context.WithTimeout(context.WithoutCancel(ctx), admissionReleaseTimeout)
		defer cancel()
		_ = permit.Release(settle, o)
	}
	returned := false
	defer func() {
		if !returned {
			// The handler panicked (the runner records it); its call may
			// have been sent.
			release(admission.CallOutcome{Result: admission.CallUncertain})
		}
	}()
	parent, _ := ctx.Value(usageKey{}).(*usageRecorder)
	usage := &usageRecorder{parent: parent}
	ctx = context.WithValue(ctx, usageKey{}, usage)
	c := &call{limiter: a.Limiter, permit: permit, pool: req.Pool}
	result, err := work(context.WithValue(ctx, callKey{}, c))
	returned = true

	c.mu.Lock()
	defer c.mu.Unlock()
	outcome := c.outcome(ctx, err)
	if outcome.Result == admission.CallUncertain {
		RecordUsage(ctx, jobs.Usage{Uncertain: true})
	}
	release(outcome)
	return result, callReport{responded: c.responded, status: c.status, cooldown: c.signal.Cooldown,
		outcome: outcome.Result, usage: usage.get()}, err
}

// outcome is how far the call got.
func (c *call) outcome(ctx context.Context, err error) admission.CallOutcome {
	usage := UsageOf(ctx)
	answered := admission.CallOutcome{Result: admission.CallAnswered, InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens}
	var notSent *notSentError
	switch {
	case c.responded && (c.status == http.StatusTooManyRequests || c.status >= 500):
		return admission.CallOutcome{Result: admission.CallUncertain}
	case c.responded:
		return answered
	case errors.As(err, &notSent):
		return admission.CallOutcome{Result: admission.CallNotSent}
	case err == nil && !usage.Uncertain:
		return answered
	}
	// An error without an answer: the call may have been sent and billed.
	return admission.CallOutcome{Result: admission.CallUncertain}
}

// acquire takes a permit for req, waiting at most MaxWait; longer waits
// and an unreachable limiter become snoozes.
func (a *Admission) acquire(ctx context.Context, req admission.Request) (*admission.Permit, error) {
	start := time.Now()
	permit, err := a.acquireWithin(ctx, req)
	if hist := a.obs.admissionWait; hist.Enabled(ctx) {
		result := "granted"
		switch {
		case errors.As(err, new(*jobs.SnoozeError)):
			result = "snoozed"
		case err != nil:
			result = "failed"
		}
		hist.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(
			attribute.String("pool", req.Pool), attribute.String("result", result)))
	}
	return permit, err
}

func (a *Admission) acquireWithin(ctx context.Context, req admission.Request) (*admission.Permit, error) {
	deadline := time.Now().Add(a.MaxWait)
	for {
		permit, err := a.Limiter.Acquire(ctx, req)
		if err == nil {
			return permit, nil
		}
		wait, isWait := admission.WaitDuration(err)
		switch {
		case isWait && time.Until(deadline) >= wait:
			if !retry.Sleep(ctx, wait) {
				return nil, ctx.Err()
			}
		case isWait:
			return nil, &jobs.SnoozeError{After: max(wait, a.MaxWait), Reason: err.Error()}
		case errors.Is(err, admission.ErrNeverAdmissible), errors.Is(err, admission.ErrInvalid):
			// No wait helps: the job is too large for its pool, or Route
			// built a request the limiter refuses.
			return nil, jobs.Permanent(err)
		case errors.Is(err, admission.ErrUnavailable):
			return nil, &jobs.SnoozeError{After: a.UnavailableSnooze, Reason: err.Error()}
		default:
			return nil, err
		}
	}
}

// admissionGate is how long the producer of queue waits before claiming.
func (r *Runner) admissionGate(ctx context.Context, queue string) time.Duration {
	if r.cfg.Admission == nil {
		return 0
	}
	return r.cfg.Admission.gate(ctx, queue)
}
