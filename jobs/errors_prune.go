package jobs

import "errors"

// ErrKeyReleased is returned by Enqueue and EnqueueMany when a job's
// idempotency key was taken as the job was inserted, but the job holding it
// was gone when it was read a statement later: retention (or a delete by
// hand) removed the holder, a finished job past its retention, in between.
// Nothing was written for the call (a batch writes nothing at all).
//
// It is transient: retry the call. The key is free by then, so the retry
// creates a new job, as any retry after the holder's pruning does (see the
// retention package's idempotency window). If it persists, the key's
// job_keys row outlived its job, which only a delete of jobs by hand that
// left job_keys behind can do; delete the key's job_keys row.
var ErrKeyReleased = errors.New("jobs: idempotency key released while enqueueing (its job was pruned); retry")
