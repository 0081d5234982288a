package schedule

import (
	"context"
	"time"
)

// Acquire takes the lease if it is free, as Run's check does: 0 if not.
func (s *Scheduler) Acquire(ctx context.Context) (int64, error) {
	epoch, _, err := s.tryAcquire(ctx)
	return epoch, err
}

// TickOnce is one tick of the active scheduler holding epoch.
func (s *Scheduler) TickOnce(ctx context.Context, epoch int64) (int, error) {
	return s.tick(ctx, epoch)
}

// Register upserts the code schedules, as Run does first.
func (s *Scheduler) Register(ctx context.Context) error { return s.register(ctx) }

var ErrLeaseLost = errLeaseLost

// JitterOffset is the offset the scheduler waits after sc's slot.
func JitterOffset(sc Schedule, slot time.Time) time.Duration {
	_, sp, err := sc.normalize()
	if err != nil {
		panic(err)
	}
	return sp.offset(slot)
}
