package admission

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
)

// Group sizes of one cycle. A cycle's statements grow with its group, and
// so does the time it holds the pool row's lock, which every other process
// waits through; the bounds keep that time short and the turns of the
// processes frequent.
const (
	maxGrantGroup   = 256
	maxReleaseGroup = 1024
)

// A release whose cycle failed is queued again, after a pause that
// doubles from releaseRetryPause up to maxReleaseRetryPause, until it
// succeeds, has failed maxReleaseAttempts times, or its permit expired
// (the reaper then frees the slot). ReleaseGroup is idempotent by permit
// id, so a try whose outcome was lost is safe to repeat.
const (
	maxReleaseAttempts   = 8
	releaseRetryPause    = 25 * time.Millisecond
	maxReleaseRetryPause = time.Second
)

// A runner goroutine whose queue emptied waits this long for the next
// queue to start, of any pool, before it ends. A closed loop of Acquire
// and Release empties its pool's queue after every cycle; reusing the
// runner spares each cycle a new goroutine and the growth of its stack to
// the depth of pgx's calls (copying stacks was 8% of a bench process's
// CPU). Flush does not wait for a lingering runner: it holds no work.
const runnerLinger = 10 * time.Millisecond

// poolQueue is one pool's queued work in this process. At most one cycle
// runs for it at a time; its runner goroutine is assigned to it only while
// work is queued (and then lingers, unassigned, for runnerLinger).
type poolQueue struct {
	name     string
	acquires []*acquireWaiter // arrival order
	releases []*releaseWaiter
	running  bool
}

// acquireWaiter is one Acquire waiting for its cycle.
type acquireWaiter struct {
	req     Request
	id      uuid.UUID
	verdict chan acquireVerdict // buffered: the cycle never blocks on it
	taken   bool                // in a cycle: no longer removable
	gone    bool                // its caller stopped waiting after it was taken
}

type acquireVerdict struct {
	permit *Permit
	err    error
}

// releaseWaiter is one Release waiting for its cycle; a nil done is a
// release nobody waits for (a permit whose acquirer left).
type releaseWaiter struct {
	permit   *Permit
	outcome  CallOutcome
	done     chan error
	taken    bool // in a cycle, or queued again after one: no longer withdrawn
	attempts int  // cycles it failed in
}

// queues holds the per-pool queues of a Postgres limiter.
type queues struct {
	mu       sync.Mutex
	byPool   map[string]*poolQueue
	retrying int           // releases waiting out their pause before they are queued again
	idle     chan struct{} // closed when the last queue empties; nil while none waits
	// spare is received from by runners whose queue emptied, for
	// runnerLinger; unbuffered, so a send succeeds only when one waits.
	spare chan queueStart
	// runners counts runner goroutines started and those still running,
	// for tests.
	runners struct{ started, running int }
}

// queueStart hands a queue to a runner, with the context its cycles keep
// the values of.
type queueStart struct {
	ctx context.Context
	q   *poolQueue
}

// Flush waits until every acquire and release this process has queued has
// been through its cycle, including the give-backs of permits granted to
// acquirers that stopped waiting. Call it before the process exits, after
// its last Acquire and Release: a give-back still queued then is lost, and
// its permit holds its slot until it expires.
func (l *Postgres) Flush(ctx context.Context) error {
	l.qs.mu.Lock()
	if len(l.qs.byPool) == 0 && l.qs.retrying == 0 {
		l.qs.mu.Unlock()
		return nil
	}
	if l.qs.idle == nil {
		l.qs.idle = make(chan struct{})
	}
	idle := l.qs.idle
	l.qs.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("admission: flushing queued acquires and releases: %w", ctx.Err())
	}
}

// enqueue adds work to pool's queue and starts its cycle goroutine if none
// runs. The goroutine keeps ctx's values but never its cancellation: one
// waiter's deadline must not end a cycle that serves others.
func (l *Postgres) enqueue(ctx context.Context, pool string, a *acquireWaiter, r *releaseWaiter) {
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	var rs []*releaseWaiter
	if r != nil {
		rs = []*releaseWaiter{r}
	}
	l.enqueueLocked(ctx, pool, a, rs)
}

// retryReleases queues again, at the head of pool's queue, releases whose
// cycle failed and whose pause is over.
func (l *Postgres) retryReleases(ctx context.Context, pool string, rs []*releaseWaiter) {
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	l.qs.retrying -= len(rs)
	l.enqueueLocked(ctx, pool, nil, rs)
}

func (l *Postgres) enqueueLocked(ctx context.Context, pool string, a *acquireWaiter, rs []*releaseWaiter) {
	q := l.qs.byPool[pool]
	if q == nil {
		q = &poolQueue{name: pool}
		l.qs.byPool[pool] = q
	}
	if a != nil {
		q.acquires = append(q.acquires, a)
	}
	if len(rs) == 1 && !rs[0].taken {
		q.releases = append(q.releases, rs[0])
	} else if len(rs) > 0 {
		// Releases tried before go first. They stay taken: a caller whose
		// context ends no longer withdraws them.
		q.releases = append(rs, q.releases...)
	}
	if !q.running {
		q.running = true
		l.startRunner(queueStart{ctx: context.WithoutCancel(ctx), q: q})
	}
}

// startRunner hands s to a lingering runner, or starts one. Called with
// l.qs.mu held; the send does not block.
func (l *Postgres) startRunner(s queueStart) {
	select {
	case l.qs.spare <- s:
	default:
		l.qs.runners.started++
		l.qs.runners.running++
		go l.runQueues(s)
	}
}

// waitAcquire waits for w's verdict or for ctx to end. A waiter whose
// context ends while it is still queued is removed and takes nothing; one
// already in a cycle is marked gone, and the cycle gives back what it is
// granted (see deliver).
func (l *Postgres) waitAcquire(ctx context.Context, pool string, w *acquireWaiter) (*Permit, error) {
	select {
	case v := <-w.verdict:
		return v.permit, v.err
	case <-ctx.Done():
	}
	l.qs.mu.Lock()
	if !w.taken {
		q := l.qs.byPool[pool]
		q.acquires = remove(q.acquires, w)
		l.qs.mu.Unlock()
		return nil, ctx.Err()
	}
	w.gone = true
	var v acquireVerdict
	select {
	case v = <-w.verdict: // delivered before it was marked gone
	default:
	}
	l.qs.mu.Unlock()
	if v.permit != nil {
		l.giveBack(ctx, v.permit)
	}
	return nil, ctx.Err()
}

// waitRelease waits for w's cycle or for ctx to end. A release still queued
// when ctx ends is withdrawn: it reports ctx's error and the permit
// expires, as it would if the database could not be reached. One already
// in a cycle goes ahead, and is tried again if that cycle fails; the
// caller is told ctx's error all the same.
func (l *Postgres) waitRelease(ctx context.Context, pool string, w *releaseWaiter) error {
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
	}
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	if !w.taken {
		q := l.qs.byPool[pool]
		q.releases = remove(q.releases, w)
	}
	return ctx.Err()
}

// giveBack releases, as never sent, a permit whose acquirer stopped
// waiting: it takes nothing.
func (l *Postgres) giveBack(ctx context.Context, p *Permit) {
	if p.released.CompareAndSwap(false, true) {
		l.enqueue(context.WithoutCancel(ctx), p.Pool, nil, &releaseWaiter{permit: p, outcome: CallOutcome{Result: CallNotSent}})
	}
}

func remove[T comparable](s []T, v T) []T {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

// runQueues is a runner goroutine: it runs s's queue until it is empty,
// then the queues handed to it while it lingers, and ends when none comes
// within runnerLinger.
func (l *Postgres) runQueues(s queueStart) {
	linger := time.NewTimer(runnerLinger)
	defer linger.Stop()
	defer func() {
		l.qs.mu.Lock()
		l.qs.runners.running--
		l.qs.mu.Unlock()
	}()
	for {
		l.runQueue(s.ctx, s.q)
		linger.Reset(runnerLinger)
		select {
		case s = <-l.qs.spare:
		case <-linger.C:
			return
		}
	}
}

// runQueue runs q's cycles until its queue is empty. It takes a connection
// slot before it takes the group, so requests that arrive while it waits
// for one join the cycle.
func (l *Postgres) runQueue(ctx context.Context, q *poolQueue) {
	for {
		l.conns <- struct{}{}
		acquires, releases := l.take(q)
		if len(acquires) == 0 && len(releases) == 0 {
			<-l.conns
			return
		}
		res := l.cycle(ctx, q.name, acquires, releases)
		<-l.conns
		l.deliver(ctx, q.name, acquires, releases, res)
	}
}

// take removes the cycle's group from q, or, with nothing queued, frees
// q's runner.
func (l *Postgres) take(q *poolQueue) ([]*acquireWaiter, []*releaseWaiter) {
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	na, nr := min(len(q.acquires), maxGrantGroup), min(len(q.releases), maxReleaseGroup)
	if na == 0 && nr == 0 {
		q.running = false
		delete(l.qs.byPool, q.name)
		if len(l.qs.byPool) == 0 && l.qs.retrying == 0 && l.qs.idle != nil {
			close(l.qs.idle)
			l.qs.idle = nil
		}
		return nil, nil
	}
	acquires := append([]*acquireWaiter(nil), q.acquires[:na]...)
	releases := append([]*releaseWaiter(nil), q.releases[:nr]...)
	q.acquires = append(q.acquires[:0], q.acquires[na:]...)
	q.releases = append(q.releases[:0], q.releases[nr:]...)
	for _, a := range acquires {
		a.taken = true
	}
	for _, r := range releases {
		r.taken = true
	}
	return acquires, releases
}

// cycleResult is what one cycle's round trip answered.
type cycleResult struct {
	rows []grantRow // one per acquire; empty for an unknown pool
	err  error
}

// grantRow is GrantGroup's answer for one request.
type grantRow struct {
	acquired, expires *time.Time
	after             PoolState
}

// cycle runs one round trip for pool: releases first, so the slots and
// refunds they free serve the grants of the same cycle. A cycle that lost
// its connection is tried once more: GrantGroup and ReleaseGroup are
// idempotent for the same permit ids.
func (l *Postgres) cycle(ctx context.Context, pool string, acquires []*acquireWaiter, releases []*releaseWaiter) cycleResult {
	res := l.try(ctx, pool, acquires, releases, false)
	if res.err != nil && connectionLost(res.err) {
		res = l.try(ctx, pool, acquires, releases, true)
	}
	return res
}

func (l *Postgres) try(ctx context.Context, pool string, acquires []*acquireWaiter, releases []*releaseWaiter, again bool) cycleResult {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	if !again && len(releases) == 0 && len(acquires) == 1 {
		if res, decided := l.acquireOne(ctx, pool, acquires[0]); decided {
			return res
		}
	}
	if !again && len(releases) == 1 && len(acquires) == 0 {
		return l.releaseOne(ctx, pool, releases[0])
	}
	b := &pgx.Batch{}
	b.Queue(l.sql.cycleSetup, l.lockTimeout)
	if len(releases) > 0 {
		ids := make([]pgtype.UUID, len(releases))
		results := make([]int16, len(releases))
		in, out := make([]int64, len(releases)), make([]int64, len(releases))
		for i, r := range releases {
			ids[i], results[i], in[i], out[i] = dbsql.UUID(r.permit.ID), int16(r.outcome.Result), r.outcome.InputTokens, r.outcome.OutputTokens
		}
		// The first permit's random tail picks the ledger shard.
		b.Queue(l.sql.releaseGroup, pool, ids, results, in, out, int16(releases[0].permit.ID[15]%ledgerShards))
	}
	var rows []grantRow
	if len(acquires) > 0 {
		ids := make([]pgtype.UUID, len(acquires))
		tokens := make([]int64, len(acquires))
		tenants := make([]string, len(acquires))
		for i, a := range acquires {
			ids[i], tokens[i], tenants[i] = dbsql.UUID(a.id), a.req.Tokens, a.req.Tenant
		}
		b.Queue(l.sql.grantGroup, pool, ids, tokens, tenants, l.cfg.Holder, l.cfg.PermitTTL, again).Query(func(r pgx.Rows) error {
			var err error
			rows, err = pgx.CollectRows(r, func(row pgx.CollectableRow) (grantRow, error) {
				s := grantScan{g: grantRow{after: PoolState{Pool: Pool{Name: pool}}}}
				err := row.Scan(s.dest()...)
				s.g.after.Cooldown = seconds(s.cooldown)
				return s.g, err
			})
			return err
		})
	}
	err := l.sendBatch(ctx, b)
	if err != nil {
		return cycleResult{err: fmt.Errorf("admission: pool %q: %w", pool, err)}
	}
	return cycleResult{rows: rows}
}

// acquireOne is the cycle of a single acquire when nothing else is queued:
// one statement (AcquireOne in queries.sql). Only a grant decides; after a
// denial (or an error) the full cycle runs and answers.
func (l *Postgres) acquireOne(ctx context.Context, pool string, a *acquireWaiter) (cycleResult, bool) {
	b := &pgx.Batch{}
	b.Queue(l.sql.cycleSetup, l.lockTimeout)
	var s grantScan
	var granted bool
	// The id as a pgtype.UUID: a uuid.UUID would be encoded through its
	// driver.Valuer, as text, after a failed plan whose error is
	// formatted on every call.
	b.Queue(l.sql.acquireOne, pool, a.req.Tokens, dbsql.UUID(a.id), a.req.Tenant, l.cfg.Holder, l.cfg.PermitTTL).Query(func(r pgx.Rows) error {
		if !r.Next() {
			return r.Err()
		}
		granted = true
		return r.Scan(s.acquiredDest()...)
	})
	if err := l.sendBatch(ctx, b); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && !connectionLost(err) && !contention(err) {
			// The server refused the statement and rolled it back: the
			// full cycle decides and reports.
			return cycleResult{}, false
		}
		// Lost, timed out or busy: reported as such (and tried again, or
		// given back, by the caller like any cycle).
		return cycleResult{err: fmt.Errorf("admission: pool %q: %w", pool, err)}, true
	}
	return cycleResult{rows: []grantRow{s.g}}, granted
}

// releaseOne is the cycle of a single release when nothing else is
// queued: one statement (ReleaseOne in queries.sql).
func (l *Postgres) releaseOne(ctx context.Context, pool string, r *releaseWaiter) cycleResult {
	b := &pgx.Batch{}
	b.Queue(l.sql.cycleSetup, l.lockTimeout)
	// The permit id's random tail picks the ledger shard.
	b.Queue(l.sql.releaseOne, dbsql.UUID(r.permit.ID), int(r.outcome.Result), r.outcome.InputTokens, r.outcome.OutputTokens,
		int16(r.permit.ID[15]%ledgerShards))
	if err := l.sendBatch(ctx, b); err != nil {
		return cycleResult{err: fmt.Errorf("admission: pool %q: %w", pool, err)}
	}
	return cycleResult{}
}

// sendBatch runs b as one transaction: the implicit transaction of a
// batch, or an explicit one on a DBTX that cannot send batches.
func (l *Postgres) sendBatch(ctx context.Context, b *pgx.Batch) error {
	if s, ok := l.db.(dbsql.BatchSender); ok {
		return s.SendBatch(ctx, b).Close()
	}
	tx, err := l.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// deliver hands each waiter of a cycle its answer. The releases of a
// failed cycle are queued again after a pause, unless they failed for the
// last time; the pool's other work goes on meanwhile.
func (l *Postgres) deliver(ctx context.Context, pool string, acquires []*acquireWaiter, releases []*releaseWaiter, res cycleResult) {
	l.noteHealth(ctx, pool, res.err, len(acquires)+len(releases))
	if res.err != nil && contention(res.err) {
		l.logContention(ctx, pool, len(acquires), len(releases), res.err)
	}
	verdicts := l.verdicts(pool, acquires, res)
	var (
		orphans []*Permit
		again   []*releaseWaiter
		pause   time.Duration
	)
	unattended := 0
	l.qs.mu.Lock()
	for _, r := range releases {
		if res.err != nil {
			r.attempts++
			if r.attempts < maxReleaseAttempts && (r.permit.Expires.IsZero() || time.Now().Before(r.permit.Expires)) {
				again = append(again, r)
				pause = max(pause, min(releaseRetryPause<<(r.attempts-1), maxReleaseRetryPause))
				continue
			}
		}
		if r.done != nil {
			r.done <- res.err
		} else if res.err != nil {
			unattended++
		}
	}
	if len(again) > 0 {
		l.qs.retrying += len(again) // Flush waits for them
		time.AfterFunc(pause, func() { l.retryReleases(ctx, pool, again) })
	}
	for i, a := range acquires {
		v := verdicts[i]
		if a.gone {
			if v.permit != nil {
				orphans = append(orphans, v.permit)
			}
			continue
		}
		a.verdict <- v
	}
	l.qs.mu.Unlock()
	if unattended > 0 && res.err != nil && !unreachable(ctx, res.err) {
		// (While the database cannot be reached, the outage's own message
		// says enough.)
		l.cfg.Logger.WarnContext(ctx, "admission: giving back permits whose acquirers left failed; they expire instead",
			"pool", pool, "permits", unattended, "attempts", maxReleaseAttempts, "ttl", l.cfg.PermitTTL, "err", res.err)
	}
	for _, p := range orphans {
		l.giveBack(ctx, p)
	}
	if res.err != nil && outcomeUnknown(res.err) {
		// The cycle may have committed before its answer was lost: give
		// back, as never sent, whatever it may have granted. A release of
		// a permit that was never granted deletes nothing.
		for _, a := range acquires {
			l.giveBack(ctx, &Permit{ID: a.id, Pool: pool, Tenant: a.req.Tenant, Tokens: a.req.Tokens, release: l.release})
		}
	}
}

// logContention says what became of a cycle that waited past the lock
// timeout for the pool row.
func (l *Postgres) logContention(ctx context.Context, pool string, acquires, releases int, err error) {
	var what string
	switch {
	case releases == 0:
		what = "a grant cycle waited past the lock timeout for the pool row; its acquirers are told to wait"
	case acquires == 0:
		what = "a release cycle waited past the lock timeout for the pool row; its releases are tried again"
	default:
		what = "a cycle waited past the lock timeout for the pool row; its acquirers are told to wait, its releases are tried again"
	}
	l.cfg.Logger.WarnContext(ctx, "admission: "+what, "pool", pool, "acquires", acquires, "releases", releases,
		"lock_timeout", l.lockTimeout, "err", err)
}

// verdicts turns a cycle's answer into one verdict per acquire.
func (l *Postgres) verdicts(pool string, acquires []*acquireWaiter, res cycleResult) []acquireVerdict {
	out := make([]acquireVerdict, len(acquires))
	if res.err != nil {
		err := res.err
		if contention(err) {
			// The server answered: the pool row was busy past the lock
			// timeout. The database is reachable; try again soon.
			err = &WaitError{Pool: pool, Reason: ReasonContention, RetryAfter: contentionRetry}
		}
		for i := range out {
			out[i].err = err
		}
		return out
	}
	if len(res.rows) != len(acquires) {
		for i := range out {
			out[i].err = fmt.Errorf("%w: %q", ErrUnknownPool, pool)
		}
		return out
	}
	var head *WaitError // the first denial: later requests queue behind it
	for i, a := range acquires {
		row := res.rows[i]
		if row.acquired != nil {
			out[i].permit = &Permit{ID: a.id, Pool: pool, Tenant: a.req.Tenant, Tokens: a.req.Tokens,
				Acquired: *row.acquired, Expires: *row.expires, release: l.release}
			continue
		}
		err := row.after.denial(a.req, l.cfg.InFlightRetry)
		var w *WaitError
		if errors.As(err, &w) {
			if w.Reason == ReasonContention && head != nil {
				// Nothing but an earlier request of the cycle stood in the
				// way: first come, first served.
				err = &WaitError{Pool: pool, Reason: head.Reason, RetryAfter: head.RetryAfter}
			} else if head == nil {
				head = w
			}
		}
		out[i].err = err
	}
	return out
}

// noteHealth logs the start and the end of a time the database could not
// be reached, once each, and resets the emergency allowance on success.
func (l *Postgres) noteHealth(ctx context.Context, pool string, err error, waiters int) {
	if err == nil {
		if l.em != nil {
			l.em.healthy()
		}
		l.healthMu.Lock()
		since := l.downSince
		l.downSince = time.Time{}
		l.healthMu.Unlock()
		if !since.IsZero() {
			l.cfg.Logger.InfoContext(ctx, "admission: the limiter's database answers again", "pool", pool, "down_for", time.Since(since).Round(time.Millisecond))
		}
		return
	}
	if !unreachable(ctx, err) {
		return
	}
	l.healthMu.Lock()
	first := l.downSince.IsZero()
	if first {
		l.downSince = time.Now()
	}
	l.healthMu.Unlock()
	if first {
		policy := "failing closed"
		if l.em != nil {
			policy = fmt.Sprintf("admitting from the emergency allowance (%v of each pool for %v)", l.em.policy.Fraction, l.em.policy.For)
		}
		l.cfg.Logger.ErrorContext(ctx, "admission: the limiter's database cannot be reached; "+policy,
			"pool", pool, "waiters", waiters, "err", err)
	}
}

// connectionLost reports an error after which the same cycle may be tried
// again on another connection: the connection broke or the server ended
// it (pg_terminate_backend, a restart), rather than an answer or a
// timeout.
func connectionLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02"
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return !netErr.Timeout()
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// outcomeUnknown reports a failed cycle that may nevertheless have
// committed: the cycle was sent, and no error came from the server (which
// rolls back the transaction of any statement it reports failed).
func outcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

// contention reports a server's answer that the pool row was busy: a lock
// timeout, a deadlock or a serialization failure.
func contention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01" || pgErr.Code == "40001")
}
