// Package leader keeps a fenced leader lease alive: the renewal loop the
// outbox relay and the scheduler share, and the release at the end of a
// lead. The lease itself (its table, its epoch, the statements that take,
// renew and release it) stays with each service; this package only decides
// when to renew, when to step down and how long a release may take.
package leader

import (
	"context"
	"log/slog"
	"time"
)

// Renewal describes one holder's lease.
type Renewal struct {
	// Lease is how long a renewal keeps the lease; it is renewed every
	// third of it.
	Lease time.Duration
	// Renew extends the lease, bounded by ctx; held is false when another
	// holder took it over (the statement touched no row).
	Renew func(ctx context.Context) (held bool, err error)
	// Free releases the lease, bounded by ctx (see Release).
	Free func(ctx context.Context) error
	// Logger, and the words its lines use: Holder ("outbox relay"), Lease
	// ("leader lease") and Rival ("relay").
	Logger              *slog.Logger
	Holder, What, Rival string
}

// Release frees the lease for the next standby's check once the lead is
// over: it runs after ctx ended, bounded by one lease, and a failure only
// leaves the lease to expire.
func (r Renewal) Release(ctx context.Context, epoch int64) {
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.Lease)
	defer cancel()
	if err := r.Free(releaseCtx); err != nil {
		r.Logger.Warn("llmq: "+r.Holder+" could not release the "+r.What+"; a standby takes over when it expires", "err", err, "epoch", epoch)
	}
}

// Keep renews the lease until ctx ends, and calls stepDown and returns
// when another holder took the lease, or when no renewal succeeded for a
// whole lease (a standby may have taken it; the holder's writes are
// fenced anyway).
func (r Renewal) Keep(ctx context.Context, stepDown context.CancelFunc, epoch int64) {
	every := r.Lease / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		renewCtx, cancel := context.WithTimeout(ctx, every)
		held, err := r.Renew(renewCtx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && !held:
			r.Logger.Warn("llmq: "+r.Holder+" lost the "+r.What+" to another "+r.Rival+"; standing by", "epoch", epoch)
			stepDown()
			return
		case err == nil:
			renewed = sent
		case time.Since(renewed) >= r.Lease:
			r.Logger.Error("llmq: "+r.Holder+" could not renew the "+r.What+" for a whole lease; standing by", "err", err, "epoch", epoch)
			stepDown()
			return
		default:
			r.Logger.Warn("llmq: "+r.Holder+" lease renewal failed; retrying", "err", err, "epoch", epoch)
		}
	}
}
