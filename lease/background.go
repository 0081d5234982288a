package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/outcome"
	"github.com/llmq/llmq/internal/pglisten"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/jobs"
)

// completer batches attempt outcomes into few transactions. A handler's
// attempt is not over until its outcome is durable: submit returns only
// after the transaction that recorded it committed (or failed for good).
type completer struct {
	r       *Runner
	pending chan *pendingCompletion
	closed  chan struct{}
	once    sync.Once
}

type pendingCompletion struct {
	completion jobs.Completion
	attempt    *attempt  // whose lease bounds how long recording is tried
	submitted  time.Time // when the outcome reached the completer
	done       chan completionDone
}

// completionDone is what became of an outcome: res when it was recorded,
// else err (jobs.ErrLeaseLost for a stale one).
type completionDone struct {
	res jobs.CompletionResult
	err error
}

// doneWith answers an outcome with its result from Complete.
func doneWith(res jobs.CompletionResult) completionDone {
	return completionDone{res: res, err: res.Err}
}

// maxCompletionBatch bounds one completion transaction, and
// completionLinger how long the first outcome of a batch waits for others.
const (
	maxCompletionBatch = 1000
	completionLinger   = 2 * time.Millisecond
)

// How long the completer waits before it tries a failed completion again:
// from firstRecordBackoff, doubling, to maxRecordBackoff, so an outcome is
// recorded within about a second of the database's return.
const (
	firstRecordBackoff = 100 * time.Millisecond
	maxRecordBackoff   = time.Second
)

func newCompleter(r *Runner) *completer {
	return &completer{r: r, pending: make(chan *pendingCompletion, maxCompletionBatch), closed: make(chan struct{})}
}

// submit hands a's outcome to the completer and waits until it is
// recorded, or given up.
func (c *completer) submit(a *attempt, completion jobs.Completion) (jobs.CompletionResult, error) {
	p := &pendingCompletion{completion: completion, attempt: a, submitted: time.Now(), done: make(chan completionDone, 1)}
	select {
	case c.pending <- p:
	case <-c.closed:
		return jobs.CompletionResult{}, errors.New("lease: runner stopped before the outcome could be recorded")
	}
	select {
	case d := <-p.done:
		return d.res, d.err
	case <-c.closed:
		return jobs.CompletionResult{}, errors.New("lease: runner stopped before the outcome could be recorded")
	}
}

func (c *completer) close() { c.once.Do(func() { close(c.closed) }) }

// completers is how many completion transactions a runner keeps in flight:
// while one commits, the next batch is already being written, and commits
// of concurrent transactions share WAL flushes.
const completers = 2

func (c *completer) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range completers {
		wg.Go(func() { c.loop(ctx) })
	}
	wg.Wait()
}

func (c *completer) loop(ctx context.Context) {
	for {
		var batch []*pendingCompletion
		select {
		case <-ctx.Done():
			return
		case p := <-c.pending:
			batch = append(batch, p)
		}
		// Gather what arrives within completionLinger of the first outcome:
		// under load one transaction then carries many outcomes instead of
		// each paying for its own commit, at the cost of at most that much
		// delay before an outcome is durable.
		linger := time.NewTimer(completionLinger)
	gather:
		for len(batch) < maxCompletionBatch {
			select {
			case p := <-c.pending:
				batch = append(batch, p)
			case <-linger.C:
				break gather
			}
		}
		linger.Stop()
		c.apply(ctx, batch)
	}
}

// apply records a batch in one transaction. If the database failed (a lost
// connection, a restart, a timeout, a conflict), the batch is tried again
// with backoff for as long as its leases allow (recordWithRetry); if the
// host's OnSucceeded hook failed, or PostgreSQL refused the statement for
// what one of the outcomes holds, the outcomes are recorded one by one, so
// that one bad outcome cannot hold back the others.
func (c *completer) apply(ctx context.Context, batch []*pendingCompletion) {
	batch, results, err := c.recordWithRetry(ctx, batch)
	var hookErr *hookError
	switch {
	case len(batch) == 0:
	case err == nil:
		for i, p := range batch {
			p.done <- doneWith(results[i])
		}
	case (errors.As(err, &hookErr) || refused(err)) && len(batch) > 1:
		c.r.cfg.Logger.Warn("llmq: recording a batch of outcomes failed; recording them one by one", "size", len(batch), "err", err)
		for _, p := range batch {
			p.done <- c.applyOne(ctx, p)
		}
	case errors.As(err, &hookErr) || refused(err):
		p := batch[0]
		p.done <- c.applyOne(ctx, p)
	default:
		for _, p := range batch {
			p.done <- p.failed(err)
		}
	}
}

// failed is the answer to p when recording it failed for good.
func (p *pendingCompletion) failed(err error) completionDone {
	return completionDone{err: fmt.Errorf("lease: recording attempt %d of job %s: %w", p.completion.Attempt, p.completion.JobID, err)}
}

// recordWithRetry records batch, and tries again with backoff while the
// database fails it for a reason other than the hook or the outcomes (a
// lost connection, a restart, a pooler's statement trouble, a timeout, a
// conflict), each outcome for as long as recordable allows: an outcome
// that is not is answered with the error and left out of the next try. It
// returns what is left of batch, with the last try's results or error.
func (c *completer) recordWithRetry(ctx context.Context, batch []*pendingCompletion) ([]*pendingCompletion, []jobs.CompletionResult, error) {
	backoff := firstRecordBackoff
	for {
		completions, claimed := make([]jobs.Completion, len(batch)), make([]*jobs.Job, len(batch))
		for i, p := range batch {
			completions[i], claimed[i] = p.completion, p.attempt.job
		}
		results, err := c.record(ctx, completions, claimed)
		var hookErr *hookError
		if err == nil || errors.As(err, &hookErr) || refused(err) {
			return batch, results, err
		}
		c.r.cfg.Logger.Warn("llmq: recording outcomes failed; retrying", "size", len(batch), "err", err, "retry_in", backoff)
		if !retry.Sleep(ctx, backoff) {
			return batch, nil, err // the runner gave up at the end of its shutdown
		}
		backoff = min(2*backoff, maxRecordBackoff)
		batch = c.dropUnrecordable(batch, err)
		if len(batch) == 0 {
			return nil, nil, err
		}
	}
}

// dropUnrecordable answers the outcomes of batch that are no longer worth
// trying (recordable) with err, and returns the others.
func (c *completer) dropUnrecordable(batch []*pendingCompletion, err error) []*pendingCompletion {
	now := time.Now()
	kept := batch[:0]
	for _, p := range batch {
		if c.r.recordable(p, now) {
			kept = append(kept, p)
			continue
		}
		p.done <- p.failed(fmt.Errorf("given up as its lease ran out: %w", err))
	}
	return kept
}

// recordable reports whether p's outcome is still worth trying to record
// at now: the lease of its attempt, as last extended, has not run out
// (after that the reaper may take the job back, and the outcome would be
// stale), and it has been tried for less than LeaseDuration (a failure
// that the heartbeats get past, which keep renewing the lease, is not
// retried for ever).
func (r *Runner) recordable(p *pendingCompletion, now time.Time) bool {
	r.mu.Lock()
	extendedAt := p.attempt.extendedAt
	r.mu.Unlock()
	return now.Before(extendedAt.Add(r.cfg.LeaseDuration)) && now.Before(p.submitted.Add(r.cfg.LeaseDuration))
}

// applyOne records one outcome whose batch failed in the host's hook or
// was refused. It tries with the hook a few times; if the hook keeps
// failing, it records the attempt as a transient failure without the hook,
// so the job is retried rather than left RUNNING until its lease expires.
// If PostgreSQL refuses this outcome itself (a host's trigger or
// constraint; results jsonb cannot hold are refused before, as the
// handler's defect), the job fails at once with class
// unrecordable and the refusal as its error: retrying would pay the
// provider again for an answer that cannot be stored. A failure of the
// database is tried again as in recordWithRetry, while recordable.
func (c *completer) applyOne(ctx context.Context, p *pendingCompletion) completionDone {
	completion := p.completion
	backoff := firstRecordBackoff
	hookFailures, fellBack := 0, false
	for {
		results, err := c.record(ctx, []jobs.Completion{completion}, []*jobs.Job{p.attempt.job})
		if err == nil {
			return doneWith(results[0])
		}
		var hookErr *hookError
		switch {
		case errors.As(err, &hookErr):
			hookFailures++
			if hookFailures >= 3 {
				completion.Outcome = jobs.OutcomeRetry
				completion.ErrorClass = jobs.ClassTransient
				completion.Error = err.Error()
				completion.Result = nil
				completion.RetryDelay = c.r.cfg.Retry.Delay(completion.Attempt, nil)
			}
		case refused(err) && !fellBack:
			c.r.cfg.Logger.Error("llmq: PostgreSQL refused an attempt's outcome; the job fails with class "+jobs.ClassUnrecordable,
				"job", completion.JobID, "attempt", completion.Attempt, "fence", completion.Fence, "outcome", completion.Outcome, "err", err)
			completion, fellBack = outcome.Unrecordable(completion, err), true
			continue // a refusal is not a busy database: no backoff
		case refused(err):
			return p.failed(err)
		}
		if !retry.Sleep(ctx, backoff) || !c.r.recordable(p, time.Now()) {
			return p.failed(err)
		}
		backoff = min(2*backoff, maxRecordBackoff)
	}
}

// refused reports whether err is the store or PostgreSQL refusing a
// statement for what it holds (a data exception, a constraint, a host
// trigger's error), which the same statement would meet again, as opposed
// to the connection's or the server's trouble (dberr.Connection: a lost
// connection, a restart, a timeout, a pooler's prepared-statement errors),
// a serialization failure or a deadlock, which a retry can get past.
func refused(err error) bool {
	if errors.Is(err, jobs.ErrInvalidParams) {
		return true
	}
	if dberr.Connection(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", // connection exception
		"25", // invalid transaction state (an idle transaction ended)
		"40", // serialization failure, deadlock
		"53", // insufficient resources
		"55", // lock not available, object in use
		"57", // operator intervention: query cancelled (timeout), shutdown
		"58": // system error
		return false
	}
	return true
}

type hookError struct{ err error }

func (e *hookError) Error() string { return "OnSucceeded hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }

// record runs one completion transaction: the fenced outcomes, then the
// host's OnSucceeded hook for each success, then commit. claimed holds
// each completion's job as its attempt claimed it.
func (c *completer) record(ctx context.Context, completions []jobs.Completion, claimed []*jobs.Job) ([]jobs.CompletionResult, error) {
	// The statement must finish even while the runner shuts down, but not
	// hang forever on a dead connection.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.r.completionTimeout())
	defer cancel()
	if hist := c.r.obs.completeDuration; hist.Enabled(ctx) {
		defer func(start time.Time) { hist.Record(ctx, time.Since(start).Seconds()) }(time.Now())
	}
	return withConn(ctx, c.r, func() ([]jobs.CompletionResult, error) { return c.recordOn(ctx, completions, claimed) })
}

func (c *completer) recordOn(ctx context.Context, completions []jobs.Completion, claimed []*jobs.Job) ([]jobs.CompletionResult, error) {
	if c.r.cfg.OnSucceeded == nil {
		// One statement is its own transaction: no BEGIN and COMMIT round
		// trips when there is nothing to add to it.
		return c.r.store.Complete(ctx, c.r.pool, completions)
	}
	var results []jobs.CompletionResult
	err := dbsql.WithTx(ctx, c.r.pool, func(tx pgx.Tx) error {
		// The transaction holds its jobs' row locks while the hooks run. A
		// hook that stalls outside the database (a call that ignores ctx)
		// would keep them, and every heartbeat of this runner waits on
		// them: Postgres ends the session once it has sat idle for the
		// completion timeout, the locks go, and the outcome is recorded
		// again.
		if _, err := tx.Exec(ctx, "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
			strconv.FormatInt(c.r.completionTimeout().Milliseconds(), 10)); err != nil {
			return err
		}
		var err error
		results, err = c.r.store.Complete(ctx, tx, completions)
		if err != nil {
			return err
		}
		for i, res := range results {
			if res.Err == nil && res.State == jobs.StateSucceeded {
				job := res.Apply(claimed[i], completions[i])
				// The hook runs in the job's trace, so that what it
				// enqueues or writes (a webhook delivery, an event)
				// joins the trace its job was accepted in.
				hookCtx := telemetry.RemoteContext(ctx, job.TraceParent)
				if err := c.r.cfg.OnSucceeded(hookCtx, tx, job); err != nil {
					if dberr.Connection(err) {
						return err // the database's trouble, not the hook's: the batch is tried again whole
					}
					return &hookError{err: err}
				}
			}
		}
		return nil
	})
	return results, err
}

// heartbeat extends every live lease once per HeartbeatInterval, in one
// statement, and cancels attempts whose lease is gone or whose job a client
// cancelled. When heartbeats fail (the database is unreachable), attempts
// are cancelled once their lease must have run out, so a cut-off worker
// stops spending on work whose result would be discarded.
func (r *Runner) heartbeat(ctx context.Context) {
	every(ctx, r.cfg.HeartbeatInterval, func() { r.heartbeatOnce(ctx) })
}

func (r *Runner) heartbeatOnce(ctx context.Context) {
	now := time.Now()
	r.mu.Lock()
	live := make([]*attempt, 0, len(r.leases))
	leases := make([]jobs.Lease, 0, len(r.leases))
	var hung []*attempt
	for _, a := range r.leases {
		switch {
		case a.hung:
			if a.hungFence == 0 {
				hung = append(hung, a) // not recorded yet: try again
			}
			continue
		case !a.hungAt.IsZero() && !now.Before(a.hungAt):
			// Given up before this heartbeat: the lease was last extended
			// before hungAt, so it expires within LeaseDuration of it.
			a.hung = true
			hung = append(hung, a)
			continue
		}
		live = append(live, a)
		leases = append(leases, jobs.Lease{JobID: a.job.ID, Fence: a.job.Fence})
	}
	r.mu.Unlock()
	// Live leases first: recording hung attempts may wait up to the
	// completion timeout, and fail at every heartbeat, which must not
	// delay the renewals.
	if len(live) > 0 {
		r.renew(ctx, live, leases)
	}
	r.abandon(ctx, hung)
}

// renew extends live's leases in one statement and cancels the attempts
// whose lease is gone, whose job was cancelled, or whose lease must have
// run out while heartbeats failed.
func (r *Runner) renew(ctx context.Context, live []*attempt, leases []jobs.Lease) {
	sentAt := time.Now()
	hbCtx, cancel := context.WithTimeout(ctx, r.cfg.HeartbeatInterval)
	res, err := r.store.Heartbeat(hbCtx, r.pool, r.cfg.WorkerID, r.cfg.LeaseDuration, leases)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.cfg.Logger.Warn("llmq: heartbeat failed", "leases", len(leases), "err", err)
		for _, a := range live {
			if time.Since(a.extendedAt) >= r.cfg.LeaseDuration {
				a.cancel(ErrLeaseLost)
			}
		}
		return
	}
	for _, a := range live {
		switch {
		case !res.Kept[a.job.ID]:
			a.cancel(ErrLeaseLost)
		case res.CancelRequested[a.job.ID]:
			a.extendedAt = sentAt
			a.cancel(ErrCancelRequested)
		default:
			a.extendedAt = sentAt
		}
	}
}

// abandon records attempts whose handlers still run past AttemptTimeout
// and HungGrace as hung (jobs.RunnerStore.MarkHung): their leases are no longer
// renewed, their jobs' fences move on, and once the leases expire the
// reaper hands the jobs to whichever runner claims them next. The
// handlers' goroutines keep their slots until they return. An attempt
// MarkHung could not record is tried again at the next heartbeat; its
// lease runs out either way.
func (r *Runner) abandon(ctx context.Context, hung []*attempt) {
	if len(hung) == 0 {
		return
	}
	given := make([]jobs.HungAttempt, len(hung))
	for i, a := range hung {
		given[i] = jobs.HungAttempt{
			Lease: jobs.Lease{JobID: a.job.ID, Fence: a.job.Fence},
			Error: fmt.Sprintf("the handler was still running %s after its timeout of %s; the runner gave up its lease (the provider call may have been billed)",
				r.cfg.HungGrace, r.cfg.AttemptTimeout),
		}
	}
	markCtx, cancel := context.WithTimeout(ctx, r.completionTimeout())
	defer cancel()
	marked, err := r.store.MarkHung(markCtx, r.pool, r.cfg.WorkerID, given)
	if err != nil {
		r.cfg.Logger.Warn("llmq: recording hung attempts failed; their leases expire anyway", "attempts", len(hung), "err", err)
		return
	}
	fences := make(map[uuid.UUID]int64, len(marked))
	for _, l := range marked {
		fences[l.JobID] = l.Fence
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range hung {
		fence, ok := fences[a.job.ID]
		if !ok {
			fence = -1 // its outcome or the reaper got there first: nothing to record
		}
		a.hungFence = fence
		if !ok {
			continue
		}
		job := a.job
		if r.obs.hung.Enabled(ctx) {
			r.obs.hung.Add(ctx, 1, r.obs.attrs(attrKey{field: "hung", queue: job.Queue, kind: job.Kind}))
		}
		r.cfg.Logger.Warn("llmq: attempt hung: its handler ignores its cancelled context; the lease is abandoned and the job will be retried once it expires",
			"job", job.ID, "tenant", job.Tenant, "kind", job.Kind, "attempt", job.Attempt, "fence", job.Fence,
			"timeout", r.cfg.AttemptTimeout, "grace", r.cfg.HungGrace)
	}
}

// every calls fn once per interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fn()
	}
}

// listen wakes the queues' producers on the store's NOTIFY channel, over a
// dedicated connection that is re-established with backoff when it drops.
// After a (re)connect every queue is woken, since notifications sent while
// disconnected are lost.
func (r *Runner) listen(ctx context.Context, wakes map[string]chan struct{}) {
	pglisten.Run(ctx, r.pool.Config().ConnConfig, []string{r.store.Channel()},
		func(_, queue string) {
			if w, ok := wakes[queue]; ok {
				signal(w)
			}
		},
		func() {
			for _, w := range wakes {
				signal(w)
			}
		},
		r.cfg.Logger)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wakeIdleTenants runs the store's idle-tenant sweep for every queue once
// per PollInterval, and wakes a queue's producer when it found work: a
// retry whose time came, or work that raced a claim.
func (r *Runner) wakeIdleTenants(ctx context.Context, wakes map[string]chan struct{}) {
	every(ctx, r.cfg.PollInterval, func() {
		for queue, wake := range wakes {
			woken, err := withConn(ctx, r, func() (int64, error) { return r.store.WakeIdleTenants(ctx, r.pool, queue, 0) })
			switch {
			case err != nil && ctx.Err() == nil:
				r.cfg.Logger.Warn("llmq: idle-tenant sweep failed", "queue", queue, "err", err)
			case woken > 0:
				signal(wake)
			}
		}
	})
}

// reap takes back expired leases and fails jobs past their deadline, every
// ReapInterval. Every runner reaps; passes skip rows another holds.
func (r *Runner) reap(ctx context.Context) {
	every(ctx, r.cfg.ReapInterval, func() {
		if _, err := r.ReapOnce(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("llmq: reaper pass failed", "err", err)
		}
	})
}

// ReapOnce runs the reaper until a pass finds less than a full batch, and
// returns what it did. Run calls it every ReapInterval.
func (r *Runner) ReapOnce(ctx context.Context) (jobs.ReapResult, error) {
	const limit = 1000
	var total jobs.ReapResult
	for {
		res, err := withConn(ctx, r, func() (jobs.ReapResult, error) {
			return r.store.Reap(ctx, r.pool, jobs.ReapParams{
				Limit:          limit,
				Backoff:        r.cfg.Retry,
				BackoffByKind:  r.cfg.RetryByKind,
				DeadlineMargin: r.cfg.DeadlineMargin,
			})
		})
		total.Rescheduled += res.Rescheduled
		total.LeaseFailed += res.LeaseFailed
		total.DeadlineFail += res.DeadlineFail
		r.countReaped(ctx, res)
		if err != nil {
			return total, err
		}
		if res.Rescheduled+res.LeaseFailed < limit && res.DeadlineFail < limit {
			return total, nil
		}
	}
}

// countReaped adds one reaper pass to llmq.reaped.
func (r *Runner) countReaped(ctx context.Context, res jobs.ReapResult) {
	if !r.obs.reaped.Enabled(ctx) {
		return
	}
	for result, n := range map[string]int64{
		"rescheduled": int64(res.Rescheduled), "lease_failed": int64(res.LeaseFailed), "deadline_failed": int64(res.DeadlineFail),
	} {
		if n > 0 {
			r.obs.reaped.Add(ctx, n, metric.WithAttributes(attribute.String("result", result)))
		}
	}
}

// warnUnservedKinds warns, once per Config.UnservedKinds, about jobs in the
// runner's queues of kinds it has no handler for that have been runnable at
// least that long: with no runner serving them they would wait unseen. A
// runner of another build may serve them during a rolling deploy; jobs it
// serves do not wait that long. It needs a store that can look
// (jobs.PostgresStore does).
func (r *Runner) warnUnservedKinds(ctx context.Context) {
	store, ok := r.store.(interface {
		UnservedKinds(ctx context.Context, db jobs.DBTX, queue string, kinds []string, waited time.Duration) ([]jobs.UnservedKind, error)
	})
	if !ok {
		return
	}
	every(ctx, r.cfg.UnservedKinds, func() {
		for queue := range r.cfg.Queues {
			unserved, err := withConn(ctx, r, func() ([]jobs.UnservedKind, error) {
				return store.UnservedKinds(ctx, r.pool, queue, r.kinds, r.cfg.UnservedKinds)
			})
			if err != nil {
				if ctx.Err() == nil {
					r.cfg.Logger.Warn("llmq: looking for jobs of kinds without a handler failed", "queue", queue, "err", err)
				}
				continue
			}
			for _, k := range unserved {
				r.cfg.Logger.Warn("llmq: runnable jobs of a kind this runner has no handler for are waiting; add a handler for the kind to lease.Config.Handlers (lease.Kinds(lease.Handle(kind, fn)) for a jobs.Kind), check the kind's spelling where it is enqueued, or enqueue it on a queue whose runners serve it",
					"queue", queue, "kind", k.Kind, "jobs", k.Runnable, "oldest", k.OldestRunnableAge.Round(time.Second), "handlers", r.kinds)
			}
		}
	})
}
