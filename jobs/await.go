package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// DefaultAwaitInterval is Await's polling interval when given none.
const DefaultAwaitInterval = 50 * time.Millisecond

// Await polls the tenant's job every interval (zero means
// DefaultAwaitInterval) until it reaches a terminal state, and returns it
// as it then is. It ends with ctx's error when ctx ends first, and with
// Get's error (ErrNotFound) when the job cannot be read. Polling, not
// LISTEN: it is for scripts, examples and tests, where a request's own
// handler runs elsewhere; a service serving many clients subscribes to the
// job's outbox events instead.
func Await(ctx context.Context, store Store, db DBTX, tenant string, id uuid.UUID, interval time.Duration) (*Job, error) {
	if interval <= 0 {
		interval = DefaultAwaitInterval
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		job, err := store.Get(ctx, db, tenant, id)
		if err != nil || job.State.Terminal() {
			return job, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("jobs: awaiting job %s (%s): %w", id, job.State, ctx.Err())
		case <-tick.C:
		}
	}
}
