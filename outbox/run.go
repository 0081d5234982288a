package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/pglisten"
	"github.com/llmq/llmq/internal/retry"
)

// Leader lease defaults and bounds (RelayConfig.LeaderLease).
const (
	defaultLeaderLease = 10 * time.Second
	minLeaderLease     = 100 * time.Millisecond
)

// Run relays until ctx ends. Any number of relays may run on one outbox,
// one per process: one of them, the active relay, holds the leader lease
// and publishes; the others stand by, each checking every StandbyPoll
// whether the lease is free, and take it over when the active relay
// stopped renewing it (see the package documentation).
//
// The active relay claims and publishes batches while there are events,
// then waits for a NOTIFY from a writer (outbox.Store.Write, or an enqueue
// on the job store's channel) or the poll interval, and prunes published
// events every PruneInterval. When ctx ends it records its last verdict
// and releases the lease, so a standby takes over at its next check.
func (r *Relay) Run(ctx context.Context) error {
	if r.cfg.MeterProvider != nil {
		reg, err := r.registerActiveGauge()
		if err != nil {
			return fmt.Errorf("outbox: relay gauges: %w", err)
		}
		defer func() { _ = reg.Unregister() }()
	}
	standingBy := false
	for {
		l, err := r.tryAcquire(ctx)
		wait := r.standbyWait(l.expiresIn)
		switch {
		case l.epoch > 0 && ctx.Err() != nil:
			// ctx ended just after the lease was taken: hand it on at
			// once rather than leave it held for a whole lease.
			r.release(ctx, l.epoch)
			return nil
		case ctx.Err() != nil:
			return nil
		case err != nil:
			err = r.store.explain(err)
			r.cfg.Logger.Warn("llmq: outbox relay could not check the leader lease; trying again", "err", err, "retry_in", wait)
		case l.epoch > 0:
			standingBy = false
			if err := r.lead(ctx, l); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
		case !standingBy:
			standingBy = true
			r.cfg.Logger.Debug("llmq: outbox relay standing by; another relay holds the leader lease", "check_every", r.cfg.StandbyPoll)
		}
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

// idleTimeoutMS is the idle_in_transaction_session_timeout of a
// transaction holding the claims' lock (see LockClaims): half the lease.
func (r *Relay) idleTimeoutMS() int64 { return max(r.cfg.LeaderLease.Milliseconds()/2, 1) }

// Active reports whether Run currently holds the leader lease, that is
// whether this relay is the one publishing.
func (r *Relay) Active() bool { return r.active.Load() }

// standbyWait is one wait between a standby's checks. A lease held by
// another relay cannot be taken before it expires, so the standby waits
// until then (expiresIn, read at its check), but never longer than
// StandbyPoll, which also bounds how late a released lease is noticed, and
// never less than half of it. The wait is shortened by up to an eighth at
// random, so relays started together do not keep checking together.
// Against an always-random wait in [StandbyPoll/2, StandbyPoll], a
// standby beside a healthy relay checks about a fifth less often; the
// failover bound (LeaderLease + StandbyPoll) is unchanged.
func (r *Relay) standbyWait(expiresIn time.Duration) time.Duration {
	poll := r.cfg.StandbyPoll
	wait := min(max(expiresIn, poll/2), poll)
	return wait - rand.N(wait/8+1)
}

// leaderLease is a lease this relay acquired, or what its check saw.
type leaderLease struct {
	epoch     int64 // 0: not acquired
	previous  string
	released  int64         // claims of the previous holder released
	expiresIn time.Duration // not acquired: when the holder's lease expires unless renewed (0: unknown or now)
}

// tryAcquire takes the leader lease if it is free. A standby's check is
// one read of the lease row on a connection borrowed from the pool; only
// when the lease is free does it take the claims' lock and acquire (see
// AcquireLease).
func (r *Relay) tryAcquire(ctx context.Context) (leaderLease, error) {
	var l leaderLease
	checkCtx, cancel := context.WithTimeout(ctx, r.cfg.LeaderLease)
	defer cancel()
	var (
		free      bool
		expiresMS float64
	)
	if err := r.pool.QueryRow(checkCtx, r.store.sql.leaseFree).Scan(&free, &expiresMS); err != nil {
		return l, fmt.Errorf("outbox: reading the leader lease: %w", err)
	}
	if !free {
		l.expiresIn = time.Duration(min(expiresMS, float64(time.Hour/time.Millisecond))) * time.Millisecond
		return l, nil
	}
	err := dbsql.WithTx(checkCtx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(checkCtx, r.store.sql.lockClaims, r.lockID, r.idleTimeoutMS()); err != nil {
			return err
		}
		// In the claims' lock, wait for no row for long (see AcquireLease).
		if _, err := tx.Exec(checkCtx, r.store.sql.claimLockTimeout, r.lockTimeout.Milliseconds()); err != nil {
			return err
		}
		var previous *string
		err := tx.QueryRow(checkCtx, r.store.sql.acquireLease, r.cfg.ID, r.cfg.LeaderLease.Milliseconds()).
			Scan(&l.epoch, &previous, &l.released)
		if errors.Is(err, pgx.ErrNoRows) {
			l = leaderLease{} // another relay took it first
			return nil
		}
		l.previous = dbsql.Deref(previous)
		return err
	})
	if err != nil {
		return leaderLease{}, fmt.Errorf("outbox: acquiring the leader lease: %w", err)
	}
	return l, nil
}

// lead relays as the active relay until ctx ends or the lease is lost,
// then releases the lease if it still holds it. An error is returned only
// for what a retry cannot fix.
func (r *Relay) lead(ctx context.Context, l leaderLease) error {
	r.cfg.Logger.Info("llmq: outbox relay active", "epoch", l.epoch, "previous", l.previous, "released_claims", l.released)
	leadCtx, stepDown := context.WithCancel(ctx)
	defer stepDown()
	r.active.Store(true)
	defer r.active.Store(false)

	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		r.renew(leadCtx, stepDown, l.epoch)
	}()
	err := r.serve(leadCtx, l.epoch)
	stepDown()
	<-renewing
	// A verdict kept for a row another session held gets a last try (it
	// waits for no row): if it is still held, the event is published
	// again once its claim runs out.
	if serr := r.settle(ctx, nil); serr != nil {
		r.cfg.Logger.Warn("llmq: outbox relay could not record its last verdicts; their events will be published again", "err", serr)
	}
	// Released whatever ended the lead: a lease another relay took is not
	// touched (the statement names this relay's epoch).
	r.release(ctx, l.epoch)
	return err
}

// renew extends the lease every third of LeaderLease, and steps down when
// another relay took it over, or when no renewal succeeded for a whole
// lease (a standby may have taken it; the claims are fenced anyway).
func (r *Relay) renew(ctx context.Context, stepDown context.CancelFunc, epoch int64) {
	r.lease(epoch).Keep(ctx, stepDown, epoch)
}

// release frees the lease for the next standby's check. It runs after ctx
// ended, with a bound of its own.
func (r *Relay) release(ctx context.Context, epoch int64) { r.lease(epoch).Release(ctx, epoch) }

// lease is the relay's leader lease under epoch, for leader's renewal loop
// and release.
func (r *Relay) lease(epoch int64) leader.Renewal {
	return leader.Renewal{
		Lease: r.cfg.LeaderLease, Logger: r.cfg.Logger, Holder: "outbox relay", What: "leader lease", Rival: "relay",
		Renew: func(ctx context.Context) (bool, error) {
			tag, err := r.pool.Exec(ctx, r.store.sql.renewLease, r.cfg.ID, epoch, r.cfg.LeaderLease.Milliseconds())
			return tag.RowsAffected() > 0, err
		},
		Free: func(ctx context.Context) error {
			_, err := r.pool.Exec(ctx, r.store.sql.releaseLease, r.cfg.ID, epoch)
			return err
		},
	}
}

// maxPassBackoff bounds the wait after a failed pass, so publication
// resumes within about a second of the database's return (the LISTEN
// connection, which would also wake the relay, is re-established more
// slowly).
const maxPassBackoff = time.Second

// serve is the active relay's loop, until ctx ends: drain, then wait for a
// NOTIFY, the poll interval, a retry after a failure, or the pruner. Only
// the active relay listens (one dedicated connection, unless
// DisableListen) and prunes.
func (r *Relay) serve(ctx context.Context, epoch int64) error {
	if r.cfg.MeterProvider != nil {
		reg, err := r.registerGauges()
		if err != nil {
			return fmt.Errorf("outbox: relay gauges: %w", err)
		}
		defer func() { _ = reg.Unregister() }()
	}
	wake := make(chan struct{}, 1)
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	if !r.cfg.DisableListen {
		listenCtx, stopListening := context.WithCancel(ctx)
		defer stopListening()
		listening := make(chan struct{})
		go func() {
			defer close(listening)
			pglisten.Run(listenCtx, r.pool.Config().ConnConfig,
				[]string{r.store.channel, r.store.schema.Channel("jobs")},
				func(string, string) { signal() }, signal, r.cfg.Logger)
		}()
		defer func() { <-listening }()
	}

	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	prune := time.NewTicker(r.cfg.PruneInterval)
	defer prune.Stop()
	backoff := time.Duration(0)
	releaseOwn := false // a pass failed for a connection reason: see drain
	for {
		_, err := r.drain(ctx, epoch, releaseOwn)
		releaseOwn = err != nil && (releaseOwn || dberr.Connection(err))
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			backoff = min(max(2*backoff, 50*time.Millisecond), maxPassBackoff)
			r.cfg.Logger.Warn("llmq: outbox relay pass failed", "err", err, "retry_in", backoff)
		default:
			backoff = 0
		}
		var retryAfter <-chan time.Time
		if backoff > 0 {
			retryAfter = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		case <-retryAfter:
		case <-prune.C:
			if _, err := r.Prune(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("llmq: outbox prune failed", "err", err)
			}
		}
	}
}
