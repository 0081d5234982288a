package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/outcome"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/jobs"
)

// Why an attempt's context was cancelled, as context.Cause reports it.
var (
	// ErrLeaseLost: a heartbeat found the lease gone (it expired, or the
	// reaper took the job back). The attempt's result will not be applied.
	ErrLeaseLost = jobs.ErrLeaseLost
	// ErrCancelRequested: a client cancelled the job while it ran.
	ErrCancelRequested = errors.New("lease: job cancellation requested")
	// ErrShutdown: the runner is shutting down and the grace period ended.
	ErrShutdown = errors.New("lease: runner shutting down")
	// ErrAttemptTimeout: the attempt ran longer than Config.AttemptTimeout.
	ErrAttemptTimeout = errors.New("lease: attempt timeout")
)

// How a producer behaves after it has seen work: it claims again every
// activePoll for activeWindow, so that jobs whose enqueue sent no NOTIFY
// (jobs.Config.NotifyInterval) or committed just after a claim are picked
// up in milliseconds rather than at the next poll.
const (
	activePoll   = 20 * time.Millisecond
	activeWindow = 250 * time.Millisecond
)

// Runner claims jobs from its queues and runs them under fenced leases. Build
// it with NewRunner and call Run.
type Runner struct {
	pool    *pgxpool.Pool
	store   jobs.RunnerStore
	cfg     Config
	kinds   []string
	running atomic.Bool
	obs     *instruments
	// policy is the runner's part of deciding an outcome, made once: each
	// attempt's decision would box cfg's retry policy again.
	policy outcome.Policy

	// wakes holds one buffered signal per queue: a NOTIFY, Wake or the
	// idle-tenant sweep found work. Created with the runner so that Wake
	// works before and between runs.
	wakes map[string]chan struct{}

	// conns holds one token per pool connection in use by the runner's
	// claims, completions and chores; see sharedConns.
	conns chan struct{}

	mu     sync.Mutex
	leases map[uuid.UUID]*attempt // live attempts by job id
	// unrecorded holds the leases whose attempt ran but whose outcome could
	// not be recorded, by job id: they are left to expire, so the reaper
	// records them as uncertain, and releaseUnheard must not take them for
	// leases never started.
	unrecorded map[uuid.UUID]unrecordedLease
}

// unrecordedLease is a lease in Runner.unrecorded.
type unrecordedLease struct {
	queue string
	fence int64
}

// attempt is one job this runner holds.
type attempt struct {
	job    *jobs.Job
	cancel context.CancelCauseFunc // cancels the attempt's context with a cause from the errors above
	// extendedAt is the local time just before the claim or the last
	// successful heartbeat was sent: the lease lasts at least
	// LeaseDuration from then. Guarded by Runner.mu.
	extendedAt time.Time
	// hungAt is when the attempt is hung if its handler still runs:
	// AttemptTimeout plus HungGrace after the handler was called; zero
	// before. Guarded by Runner.mu.
	hungAt time.Time
	// hung is set once the runner has given the attempt up: its lease is
	// no longer renewed. hungFence is the fence MarkHung moved the job to,
	// zero until that is recorded. Guarded by Runner.mu.
	hung      bool
	hungFence int64
}

// sharedConns is how many connections of its pool a runner's claims,
// completions and chores (the reaper, the idle-tenant sweeps, the
// unserved-kinds check, the rare reads of an attempt history or of leases
// after a failed claim) use at once, whatever MaxWorkers or the number of
// queues: each statement or transaction holds one of these while it runs.
// Heartbeats (and the marking of hung attempts) run in one goroutine of
// their own, outside this budget, so a lease is never renewed late because
// completions are busy: a runner uses at most sharedConns+1 connections of
// its pool. LISTEN holds one more connection of its own, outside the pool.
const sharedConns = 2

// routePoolCheckTimeout bounds Run's question to the limiter about the
// pools of Admission.Routes.
const routePoolCheckTimeout = 5 * time.Second

// withConn runs fn holding one of the runner's sharedConns slots.
func withConn[T any](ctx context.Context, r *Runner, fn func() (T, error)) (T, error) {
	select {
	case r.conns <- struct{}{}:
	case <-ctx.Done():
		var zero T
		return zero, context.Cause(ctx)
	}
	defer func() { <-r.conns }()
	return fn()
}

// NewRunner validates cfg and returns a runner that claims through store
// on pool. Nothing starts until Run.
func NewRunner(pool *pgxpool.Pool, store jobs.RunnerStore, cfg Config) (*Runner, error) {
	if pool == nil || store == nil {
		return nil, fmt.Errorf("%w: NewRunner needs a pool and a store", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// A store that can say which queues it accepts lets a typo fail here
	// rather than as a claim error logged on every poll.
	if configured, ok := store.(interface{ Config() jobs.Config }); ok {
		known := configured.Config().Queues
		for q := range cfg.Queues {
			if !slices.Contains(known, q) {
				return nil, fmt.Errorf("%w: queue %q is not one of the store's queues %q", ErrInvalidConfig, q, known)
			}
		}
	}
	kinds := make([]string, 0, len(cfg.Handlers))
	for kind := range cfg.Handlers {
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	wakes := make(map[string]chan struct{}, len(cfg.Queues))
	for q := range cfg.Queues {
		wakes[q] = make(chan struct{}, 1)
	}
	return &Runner{pool: pool, store: store, cfg: cfg, kinds: kinds, obs: cfg.obs, policy: outcomePolicy(cfg), wakes: wakes,
		conns: make(chan struct{}, sharedConns), leases: map[uuid.UUID]*attempt{}, unrecorded: map[uuid.UUID]unrecordedLease{}}, nil
}

// WorkerID is the name this runner holds leases under.
func (r *Runner) WorkerID() string { return r.cfg.WorkerID }

// Wake tells the runner that queue has committed work, as the enqueue
// NOTIFY does: its producer claims at once if it has free slots. It is for
// hosts that carry job signals on a broker (a consumer of the store's
// "<kind>.requested" events calls it) and may be called from any goroutine,
// before or during Run; it never blocks, and wake-ups that arrive while one
// is pending coalesce. It reports whether the runner serves queue.
//
// A wake-up is only a hint: the claim reads Postgres, so a lost, late or
// duplicated one changes when work starts, never what runs.
func (r *Runner) Wake(queue string) bool {
	w, ok := r.wakes[queue]
	if ok {
		signal(w)
	}
	return ok
}

// Run claims and runs jobs until ctx is cancelled, then shuts down
// gracefully: it stops claiming, lets in-flight attempts finish within
// ShutdownGrace, cancels the rest (their jobs are released for another
// runner at once, not left to expire), and returns once every attempt's
// outcome is recorded. It returns nil after a clean shutdown. A Runner runs
// once at a time.
//
// Before it claims anything, Run asks the limiter about every pool of
// Config.Admission.Routes and returns an error wrapping ErrInvalidConfig
// that names the kind, candidate and pool if one does not exist (a limiter
// that cannot answer is not held against the route).
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("lease: Run called while the runner is already running")
	}
	defer r.running.Store(false)
	if r.cfg.Admission != nil {
		check, cancel := context.WithTimeout(ctx, routePoolCheckTimeout)
		err := r.cfg.Admission.checkPools(check)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if gauges, ok := r.store.(interface {
		RegisterGauges(jobs.DBTX, jobs.GaugeConfig) (metric.Registration, error)
	}); ok && r.cfg.MeterProvider != nil && !r.cfg.NoQueueGauges {
		reg, err := gauges.RegisterGauges(r.pool, jobs.GaugeConfig{MeterProvider: r.cfg.MeterProvider, Refresh: r.cfg.GaugeRefresh})
		if err != nil {
			return err
		}
		defer func() { _ = reg.Unregister() }()
	}

	// background lives until every attempt has been recorded: heartbeats and
	// completions must outlast ctx. work is the parent of every attempt's
	// context and is cancelled when the grace period ends.
	background, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(ErrShutdown)

	completer := newCompleter(r)
	var bg sync.WaitGroup
	bg.Go(func() { completer.run(background) })
	bg.Go(func() { r.heartbeat(background) })

	wakes := r.wakes
	var loops sync.WaitGroup
	if !r.cfg.DisableListen {
		loops.Go(func() { r.listen(ctx, wakes) })
	}
	loops.Go(func() { r.reap(ctx) })
	loops.Go(func() { r.wakeIdleTenants(ctx, wakes) })
	if r.cfg.UnservedKinds > 0 {
		loops.Go(func() { r.warnUnservedKinds(ctx) })
	}

	var attempts sync.WaitGroup
	for name, q := range r.cfg.Queues {
		p := &producer{r: r, queue: name, maxWorkers: q.MaxWorkers, lowShare: q.LowPriorityShare, wake: wakes[name], freed: make(chan struct{}, 1),
			attrs: attribute.NewSet(attribute.String("queue", name))}
		loops.Go(func() { p.run(ctx, work, &attempts, completer) })
	}

	<-ctx.Done()
	loops.Wait() // no new claims from here on

	finished := make(chan struct{})
	go func() { attempts.Wait(); close(finished) }()
	grace := time.NewTimer(r.cfg.ShutdownGrace)
	defer grace.Stop()
	var err error
	select {
	case <-finished:
	case <-grace.C:
		r.cfg.Logger.Info("llmq: shutdown grace over; cancelling attempts still running", "count", r.liveCount())
		stopWork(ErrShutdown)
		// Handlers that honour their context return at once; give the rest
		// one more grace period (and their outcomes time to be recorded),
		// then leave them: their leases expire, the reaper takes the jobs
		// back, and fencing discards anything they do. An outcome the
		// database cannot take meanwhile (it is away) is given up too.
		grace.Reset(r.cfg.ShutdownGrace + r.completionTimeout())
		select {
		case <-finished:
		case <-grace.C:
			err = fmt.Errorf("lease: %d attempts ignored cancellation or could not record their outcomes, and are left to their leases", r.liveCount())
		}
	}
	completer.close()
	stopBackground()
	bg.Wait()
	if r.cfg.Admission != nil {
		r.cfg.Admission.flush(ctx, r.cfg.Logger)
	}
	return err
}

// completionTimeout bounds one completion transaction: long enough to ride
// out a slow commit, well within the lease the completion belongs to.
func (r *Runner) completionTimeout() time.Duration { return r.cfg.LeaseDuration / 3 }

func (r *Runner) liveCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.leases)
}

// producer is one queue's claim loop.
type producer struct {
	r          *Runner
	queue      string
	maxWorkers int
	lowShare   float64
	inFlight   atomic.Int64
	wake       chan struct{} // a NOTIFY or Wake for this queue arrived
	freed      chan struct{} // an attempt finished and released its slot
	attrs      attribute.Set // the queue, for its metrics
}

func (p *producer) run(ctx, work context.Context, attempts *sync.WaitGroup, c *completer) {
	cfg := p.r.cfg
	poll := time.NewTicker(cfg.PollInterval)
	defer poll.Stop()
	var activeUntil, lastClaim time.Time
	backoff := time.Duration(0)
	notified := false // the last wake-up was a NOTIFY or Wake: committed work exists
	// After a failed claim, when to look for leases it took anyway (see
	// releaseUnheard); zero when there is nothing to look for.
	var unheardCheck time.Time
	for {
		if !unheardCheck.IsZero() && !time.Now().Before(unheardCheck) && p.releaseUnheard(ctx) {
			unheardCheck = time.Time{}
		}
		free := p.maxWorkers - int(p.inFlight.Load())
		claimed := 0
		if free > 0 {
			if wait := p.r.admissionGate(ctx, p.queue); wait > 0 {
				if !retry.Sleep(ctx, wait) {
					return
				}
				continue // claim only once a permit can be had soon
			}
			if wait := cfg.ClaimCooldown - time.Since(lastClaim); wait > 0 && !retry.Sleep(ctx, wait) {
				return
			}
			free = p.maxWorkers - int(p.inFlight.Load())
			limit := min(free, cfg.ClaimBatch)
			extendedAt := time.Now()
			lastClaim = extendedAt
			batch, err := p.claim(ctx, limit)
			switch {
			case err != nil && ctx.Err() != nil:
				return
			case err != nil:
				if unheardCheck.IsZero() {
					// By then a claim whose reply was lost has committed or
					// never will: its timeout is past.
					unheardCheck = time.Now().Add(p.r.completionTimeout())
				}
				backoff = min(max(2*backoff, 50*time.Millisecond), 5*time.Second)
				cfg.Logger.Warn("llmq: claim failed", "queue", p.queue, "err", err, "retry_in", backoff)
				if !retry.Sleep(ctx, backoff) {
					return
				}
				continue
			}
			backoff = 0
			claimed = len(batch)
			// Claimed jobs start even if shutdown began meanwhile: the grace
			// period and the release at its end cover them, where dropping
			// them would leave them RUNNING until their leases expired.
			for _, job := range batch {
				p.inFlight.Add(1)
				attemptCtx, a := p.r.track(work, job, extendedAt)
				attempts.Go(func() {
					defer p.release()
					p.r.execute(attemptCtx, a, c)
				})
			}
			if ctx.Err() != nil {
				return
			}
			if claimed == limit {
				continue // there may be more: claim again while slots are free
			}
			if notified && p.wakeRecentlyIdle(ctx) {
				notified = false
				continue // a tenant was idle by mistake: claim its work now
			}
			if claimed > 0 {
				activeUntil = time.Now().Add(activeWindow)
			}
		}

		free -= claimed
		var ok bool
		if notified, ok = p.wait(ctx, poll.C, free, &activeUntil); !ok {
			return
		}
	}
}

// claim claims up to limit jobs. The claim is not cancelled by shutdown:
// cancelling it mid-commit could leave it committed with the runner never
// hearing of its jobs. It is bounded by a timeout instead.
func (p *producer) claim(ctx context.Context, limit int) ([]*jobs.Job, error) {
	cfg := p.r.cfg
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.r.completionTimeout())
	defer cancel()
	start := time.Now()
	batch, err := withConn(claimCtx, p.r, func() ([]*jobs.Job, error) {
		return p.r.store.Claim(claimCtx, p.r.pool, jobs.ClaimParams{
			Queue: p.queue, Kinds: p.r.kinds, Worker: cfg.WorkerID, Limit: limit, LeaseDuration: cfg.LeaseDuration,
			LowPriorityShare: p.lowShare,
		})
	})
	if err == nil {
		obs := p.r.obs
		if obs.claimDuration.Enabled(ctx) {
			obs.claimDuration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributeSet(p.attrs))
		}
		if len(batch) > 0 && obs.claimed.Enabled(ctx) {
			obs.claimed.Add(ctx, int64(len(batch)), metric.WithAttributeSet(p.attrs))
		}
	}
	return batch, err
}

// releaseUnheard gives back the leases of this queue that Postgres says
// this runner holds and the runner does not know of: those of a claim that
// committed after its reply was lost (a dropped connection, a timeout
// during the commit). Without this they would sit RUNNING until their
// leases expired, and the reaper would then count an attempt that never
// started, marked uncertain. Each is snoozed with no delay, so it is
// claimable at once, keeps its attempt budget, and its attempt row says
// what happened. The producer calls this between claims, so no claim of
// its own is in flight, and an attempt stays tracked until its outcome is
// durable: every untracked lease is one it never heard of. It reports
// whether the check ran; on an error it is tried again on the next turn.
func (p *producer) releaseUnheard(ctx context.Context) bool {
	r := p.r
	held, err := withConn(ctx, r, func() ([]*jobs.Job, error) { return r.store.Leases(ctx, r.pool, r.cfg.WorkerID, p.queue) })
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("llmq: reading this runner's leases after a failed claim", "queue", p.queue, "err", err)
		}
		return false
	}
	var release []jobs.Completion
	r.mu.Lock()
	for _, job := range held {
		if _, tracked := r.leases[job.ID]; tracked {
			continue
		}
		if l, ok := r.unrecorded[job.ID]; ok && l.fence == job.Fence {
			continue
		}
		release = append(release, jobs.Completion{
			Lease:   jobs.Lease{JobID: job.ID, Fence: job.Fence},
			Attempt: job.Attempt,
			Worker:  r.cfg.WorkerID,
			Outcome: jobs.OutcomeSnoozed,
			Error:   unheardClaim,
		})
	}
	// An unrecorded lease of this queue that is no longer held has been
	// reaped: forget it.
	for id, l := range r.unrecorded {
		if l.queue == p.queue && !slices.ContainsFunc(held, func(j *jobs.Job) bool { return j.ID == id && j.Fence == l.fence }) {
			delete(r.unrecorded, id)
		}
	}
	r.mu.Unlock()
	if len(release) == 0 {
		return true
	}
	if _, err := withConn(ctx, r, func() ([]jobs.CompletionResult, error) { return r.store.Complete(ctx, r.pool, release) }); err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("llmq: releasing leases of a claim whose reply was lost", "queue", p.queue, "jobs", len(release), "err", err)
		}
		return false
	}
	r.cfg.Logger.Warn("llmq: released leases of a claim whose reply was lost; they are claimable again", "queue", p.queue, "jobs", len(release))
	return true
}

// unheardClaim is the attempt error of a lease released by releaseUnheard.
const unheardClaim = "released unstarted: the claim committed but its reply never reached the runner"

// recentIdle is how far back wakeRecentlyIdle looks: far longer than any
// claim transaction a NOTIFY could have raced.
const recentIdle = 5 * time.Second

// wakeRecentlyIdle makes active again the queue's tenants that a claim
// marked idle in the last recentIdle and that have work now, and reports
// whether it found any. A NOTIFY followed by a claim that came up short
// means committed work the claim did not see: most often another runner
// took it, but it may belong to a tenant that a concurrent claim marked idle
// before the enqueue committed. The poll-interval sweep would find it too;
// this finds it at once.
func (p *producer) wakeRecentlyIdle(ctx context.Context) bool {
	woken, err := withConn(ctx, p.r, func() (int64, error) { return p.r.store.WakeIdleTenants(ctx, p.r.pool, p.queue, recentIdle) })
	if err != nil && ctx.Err() == nil {
		p.r.cfg.Logger.Warn("llmq: idle-tenant sweep failed", "queue", p.queue, "err", err)
	}
	return woken > 0
}

// wait blocks until the producer should claim again: a NOTIFY for its
// queue (notified), a slot freed while the queue was saturated or active,
// the short active poll, or the fallback poll. ok is false when ctx is done.
func (p *producer) wait(ctx context.Context, poll <-chan time.Time, free int, activeUntil *time.Time) (notified, ok bool) {
	var quick <-chan time.Time
	if free > 0 && time.Now().Before(*activeUntil) {
		t := time.NewTimer(activePoll)
		defer t.Stop()
		quick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false, false
		case <-p.wake:
			*activeUntil = time.Now().Add(activeWindow)
			return true, true
		case <-p.freed:
			// Claim only when the free slot can matter: the queue was full,
			// or work was seen recently. Otherwise the last claim already
			// found the queue empty.
			if free <= 0 || time.Now().Before(*activeUntil) {
				return false, true
			}
		case <-quick:
			return false, true
		case <-poll:
			return false, true
		}
	}
}

func (p *producer) release() {
	p.inFlight.Add(-1)
	select {
	case p.freed <- struct{}{}:
	default:
	}
}

// track registers a claimed job as a live attempt with its own context.
func (r *Runner) track(work context.Context, job *jobs.Job, extendedAt time.Time) (context.Context, *attempt) {
	ctx, cancel := context.WithCancelCause(work)
	a := &attempt{job: job, cancel: cancel, extendedAt: extendedAt}
	r.mu.Lock()
	r.leases[job.ID] = a
	r.mu.Unlock()
	return ctx, a
}

func (r *Runner) untrack(a *attempt) {
	r.mu.Lock()
	if r.leases[a.job.ID] == a {
		delete(r.leases, a.job.ID)
	}
	r.mu.Unlock()
	a.cancel(context.Canceled)
}

// execute runs one attempt and records its outcome. The lease stays tracked
// (and heartbeated) until the outcome is durable.
func (r *Runner) execute(ctx context.Context, a *attempt, c *completer) {
	defer r.untrack(a)
	job := a.job
	ctx, span, logger := r.startAttempt(ctx, job)
	if job.ReusedFrom != uuid.Nil {
		r.reuse(ctx, a, c, span, logger)
		return
	}
	handler := r.cfg.Handlers[job.Kind]
	recorder, route := &usageRecorder{}, &routeRecord{}
	ctx, cancel := context.WithTimeoutCause(ctx, r.cfg.AttemptTimeout, ErrAttemptTimeout)
	ctx = context.WithValue(ctx, usageKey{}, recorder)
	ctx = context.WithValue(ctx, routeKey{}, route)
	ctx = context.WithValue(ctx, stepKey{}, &stepScope{r: r, job: job})
	started := time.Now()
	r.mu.Lock()
	a.hungAt = started.Add(r.cfg.AttemptTimeout + r.cfg.HungGrace)
	r.mu.Unlock()
	result, err := safeWork(ctx, handler, job)
	ran := time.Since(started)
	r.mu.Lock()
	a.hungAt = time.Time{} // returned: recording its outcome is not hanging
	r.mu.Unlock()
	cause := context.Cause(ctx)
	cancel()

	invalidBefore := 0
	if invalid := (*jobs.InvalidOutputError)(nil); errors.As(err, &invalid) {
		invalidBefore = r.invalidAttempts(ctx, job, logger)
	}
	completion := r.decide(job, result, err, cause, invalidBefore)
	route.fill(&completion)
	// Each outcome is checked before it joins a batch: one the store would
	// refuse would fail every outcome batched with it.
	if problem := completion.Validate(); problem != nil {
		completion = outcome.Defective(completion, result, problem)
		logger.Error("llmq: the handler broke its contract; the job fails with class "+jobs.ClassHandlerDefect, "err", completion.Error)
	}
	completion.Usage = recorder.get()
	if cause != nil && err != nil && completion.Outcome != jobs.OutcomeSucceeded {
		// The call may have reached the provider and been billed even though
		// no answer came back.
		completion.Usage.Uncertain = true
	}
	r.record(ctx, a, c, completion, ran, span, logger)
}

// reuse records a claimed job whose claim found a result to reuse
// (jobs.Reuse): a success with that result, naming its source, without
// calling the handler, so no provider call, permit or usage. It is
// recorded as any success is, under the attempt's fence, with the host's
// OnSucceeded hook and the job's lifecycle event.
func (r *Runner) reuse(ctx context.Context, a *attempt, c *completer, span trace.Span, logger *slog.Logger) {
	job := a.job
	completion := r.policy.Base(job)
	completion.Outcome, completion.Result, completion.ReusedFrom = jobs.OutcomeSucceeded, job.Result, job.ReusedFrom
	logger.Debug("llmq: reusing the result of an earlier job", "source_job", job.ReusedFrom)
	r.record(ctx, a, c, completion, 0, span, logger)
}

// record submits an attempt's outcome and reports what became of it.
func (r *Runner) record(ctx context.Context, a *attempt, c *completer, completion jobs.Completion, ran time.Duration,
	span trace.Span, logger *slog.Logger) {
	job := a.job
	res, err := c.submit(a, completion)
	var recorded *jobs.CompletionResult // nil unless the outcome was recorded
	if err == nil {
		recorded = &res
	}
	r.endAttempt(context.WithoutCancel(ctx), span, job, completion, ran, recorded, err)
	if r.cfg.AfterRecord != nil {
		var as *jobs.Job
		if err == nil {
			as = res.Apply(job, completion)
		}
		r.cfg.AfterRecord(as, err)
	}
	switch {
	case errors.Is(err, jobs.ErrLeaseLost):
		if fence := r.hungFence(a); fence > 0 {
			// The job stays RUNNING under that fence until the reaper takes
			// it back: not a lease this runner failed to hear of.
			r.mu.Lock()
			r.unrecorded[job.ID] = unrecordedLease{queue: job.Queue, fence: fence}
			r.mu.Unlock()
			logger.Warn("llmq: a hung attempt returned; its outcome was recorded as stale", "ran", ran, "outcome", completion.Outcome)
			break
		}
		logger.Info("llmq: stale completion discarded")
	case err != nil:
		r.mu.Lock()
		r.unrecorded[job.ID] = unrecordedLease{queue: job.Queue, fence: job.Fence}
		r.mu.Unlock()
		logger.Error("llmq: recording an attempt failed; the lease will expire and the reaper retry the job", "err", err)
	case logger.Enabled(ctx, slog.LevelDebug):
		// Asked first: a disabled Debug call still builds its record,
		// deep enough to grow a fresh attempt goroutine's stack.
		logger.Debug("llmq: attempt recorded", "state", res.State)
	}
}

// hungFence is the fence MarkHung moved a's job to; zero or less if it did
// not.
func (r *Runner) hungFence(a *attempt) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return a.hungFence
}

// safeWork calls the handler, turning a panic into an error.
func safeWork(ctx context.Context, h Handler, job *jobs.Job) (result json.RawMessage, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return h.Work(ctx, job)
}

type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	const maxStack = 2000
	stack := e.stack
	if len(stack) > maxStack {
		stack = stack[:maxStack]
	}
	return fmt.Sprintf("handler panicked: %v\n%s", e.value, stack)
}

// invalidAttempts counts the job's earlier attempts that ended in invalid
// output: the invalid-output budget counts those alone, not timeouts, lost
// leases or snoozes. It reads the attempt history, on this rare path only;
// if it cannot, it counts none, and MaxAttempts still bounds the retries.
func (r *Runner) invalidAttempts(ctx context.Context, job *jobs.Job, logger *slog.Logger) int {
	ctx = context.WithoutCancel(ctx)
	history, err := withConn(ctx, r, func() ([]jobs.Attempt, error) { return r.store.Attempts(ctx, r.pool, job.Tenant, job.ID) })
	if err != nil {
		logger.Warn("llmq: reading the attempt history for the invalid-output budget", "err", err)
		return 0
	}
	n := 0
	for _, a := range history {
		if a.ErrorClass == jobs.ClassInvalidOutput {
			n++
		}
	}
	return n
}

// decide turns a handler's return into the completion to record: the
// runner's own causes (a cancellation, a shutdown, the attempt timeout, a
// panic) first, then what the handler returned (outcome.Policy.Decide).
// invalidBefore is how many of the job's earlier attempts ended in invalid
// output.
func (r *Runner) decide(job *jobs.Job, result json.RawMessage, err error, cause error, invalidBefore int) jobs.Completion {
	policy := r.policy
	if err == nil {
		// A success decides nothing: answered here, the attempt's
		// goroutine does not grow its stack to Decide's frames, which
		// are sized for every other outcome.
		return policy.Succeeded(job, result)
	}
	c := policy.Base(job)
	var (
		panicE *panicError
		snooze *jobs.SnoozeError
	)
	switch {
	case errors.Is(cause, ErrCancelRequested):
		c.Outcome, c.ErrorClass, c.Error = jobs.OutcomeCancelled, jobs.ClassCancelled, err.Error()
		return c
	case errors.As(err, &snooze):
	case errors.Is(cause, ErrShutdown):
		c.Outcome, c.ErrorClass, c.Error = jobs.OutcomeReleased, jobs.ClassShutdown, err.Error()
		return c
	case errors.Is(cause, ErrAttemptTimeout):
		c.Error = fmt.Sprintf("attempt timed out after %s: %v", r.cfg.AttemptTimeout, err)
		return policy.Retry(job, c, jobs.ClassTimeout, 0)
	case errors.As(err, &panicE):
		c.Error = err.Error()
		return policy.Retry(job, c, jobs.ClassPanic, 0)
	}
	return policy.Decide(job, result, err, invalidBefore)
}

// outcomePolicy is a runner's part of deciding an outcome, from its
// configuration.
func outcomePolicy(cfg Config) outcome.Policy {
	return outcome.Policy{
		Worker:                cfg.WorkerID,
		DeadlineMargin:        cfg.DeadlineMargin,
		Backoff:               cfg.retryPolicy,
		InvalidOutputAttempts: cfg.InvalidOutputAttempts,
		FailInvalidOutput:     cfg.InvalidOutput == InvalidOutputFail,
	}
}
