package jobs_test

import (
	"encoding/json"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// claim claims one job of kind "k" from the default queue as worker.
func (f *fixture) claim(t *testing.T, worker string) *jobs.Job {
	t.Helper()
	claimed, err := f.store.Claim(t.Context(), f.pool, jobs.ClaimParams{
		Queue: "default", Kinds: []string{"k"}, Worker: worker, Limit: 1, LeaseDuration: time.Minute,
	})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "worker %s claims a job", worker)
	return claimed[0]
}

// expireLease ends a lease now, as if its worker had paused past it.
func (f *fixture) expireLease(t *testing.T, id uuid.UUID) {
	t.Helper()
	f.setState(t, id, "lease_until = now() - interval '1 millisecond'")
}

func succeeded(j *jobs.Job, result string) jobs.Completion {
	return jobs.Completion{
		Lease:   jobs.Lease{JobID: j.ID, Fence: j.Fence},
		Attempt: j.Attempt,
		Worker:  j.LeaseOwner,
		Outcome: jobs.OutcomeSucceeded,
		Result:  json.RawMessage(result),
	}
}

// Worker A's lease expires, the reaper takes the job back, worker B claims
// it and succeeds; A's late completion changes nothing, is reported as
// ErrLeaseLost and recorded as stale on A's own attempt row.
func TestStaleCompletionCannotOverwrite(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)

	a := f.claim(t, "worker-a")
	require.Equal(t, jobs.StateRunning, a.State)
	require.Equal(t, 1, a.Attempt)
	require.Equal(t, int64(1), a.Fence)
	require.Equal(t, res.Job.StateVersion+1, a.StateVersion, "the claim is a transition too")

	f.expireLease(t, a.ID)
	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{Backoff: llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond}})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Rescheduled)
	require.Eventually(t, func() bool {
		j, err := f.store.Get(ctx, f.pool, "acme", a.ID)
		return err == nil && !j.AvailableAt.After(time.Now())
	}, 5*time.Second, 5*time.Millisecond)

	b := f.claim(t, "worker-b")
	require.Equal(t, 2, b.Attempt, "the attempt counter continues")
	require.Equal(t, int64(3), b.Fence, "claim, reap and claim each moved the fence")

	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(b, `{"by":"b"}`)})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
	require.Equal(t, jobs.StateSucceeded, out[0].State)
	after := f.rawJob(t, a.ID)

	out, err = f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(a, `{"by":"a"}`)})
	require.NoError(t, err)
	require.ErrorIs(t, out[0].Err, jobs.ErrLeaseLost)
	require.Nil(t, out[0].Apply(a, succeeded(a, `{"by":"a"}`)))
	require.Equal(t, after, f.rawJob(t, a.ID), "the stale completion changed nothing on the job")

	job, err := f.store.Get(ctx, f.pool, "acme", res.Job.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"by":"b"}`, string(job.Result), "B's result stands")

	attempts, err := f.store.Attempts(ctx, f.pool, "acme", job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.AttemptStale, attempts[0].Outcome)
	require.Equal(t, "worker-a", attempts[0].Worker)
	require.Contains(t, attempts[0].Error, "lease_expired", "the row keeps what happened first")
	require.True(t, attempts[0].Usage.Uncertain)
	require.Equal(t, jobs.AttemptSucceeded, attempts[1].Outcome)
	require.Equal(t, "worker-b", attempts[1].Worker)

	events := f.events(t)
	require.Len(t, events, 2, "requested, then one completed event: none for the stale attempt")
	require.Equal(t, "k.completed", events[1].eventType)
}

// Without a reaper pass, an expired lease still cannot be heartbeated back
// to life, and its completion is still fenced once another claim happens.
func TestHeartbeatDoesNotResurrectAnExpiredLease(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	live := f.claim(t, "w")
	lapsed := f.claim(t, "w")
	f.expireLease(t, lapsed.ID)

	hb, err := f.store.Heartbeat(ctx, f.pool, "w", time.Minute, []jobs.Lease{
		{JobID: live.ID, Fence: live.Fence}, {JobID: lapsed.ID, Fence: lapsed.Fence},
	})
	require.NoError(t, err)
	require.True(t, hb.Kept[live.ID])
	require.False(t, hb.Kept[lapsed.ID])

	hb, err = f.store.Heartbeat(ctx, f.pool, "another-worker", time.Minute, []jobs.Lease{{JobID: live.ID, Fence: live.Fence}})
	require.NoError(t, err)
	require.False(t, hb.Kept[live.ID], "only the owner extends a lease")

	_, err = f.store.Cancel(ctx, f.pool, "acme", live.ID)
	require.NoError(t, err)
	hb, err = f.store.Heartbeat(ctx, f.pool, "w", time.Minute, []jobs.Lease{{JobID: live.ID, Fence: live.Fence}})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested[live.ID], "a heartbeat tells the worker about a cancellation")
}

func TestCompleteOutcomes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	enqueue := func(p jobs.EnqueueParams) {
		p.Tenant, p.Kind = "acme", "k"
		_, err := f.store.Enqueue(ctx, f.pool, p)
		require.NoError(t, err)
	}

	tests := []struct {
		name       string
		params     jobs.EnqueueParams
		completion func(j *jobs.Job) jobs.Completion
		state      jobs.State
		class      string
		attempt    jobs.AttemptOutcome
		event      string
	}{
		{"review", jobs.EnqueueParams{}, func(j *jobs.Job) jobs.Completion {
			c := succeeded(j, `{"total":"12.00"}`)
			c.Outcome, c.Error = jobs.OutcomeReviewRequired, "totals do not add up"
			return c
		}, jobs.StateReviewRequired, "", jobs.AttemptReviewRequired, "k.review_required"},
		{"permanent", jobs.EnqueueParams{}, func(j *jobs.Job) jobs.Completion {
			return jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
				Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassPermanent, Error: "400: bad document"}
		}, jobs.StateFailedTerminal, jobs.ClassPermanent, jobs.AttemptFailed, "k.dead_lettered"},
		{"retry", jobs.EnqueueParams{}, func(j *jobs.Job) jobs.Completion {
			return jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
				Outcome: jobs.OutcomeRetry, ErrorClass: jobs.ClassTransient, Error: "503", RetryDelay: time.Minute}
		}, jobs.StateRetryScheduled, jobs.ClassTransient, jobs.AttemptRetryScheduled, "k.retry_scheduled"},
		{"retry past the deadline", jobs.EnqueueParams{DeadlineAt: time.Now().Add(5 * time.Second)}, func(j *jobs.Job) jobs.Completion {
			return jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
				Outcome: jobs.OutcomeRetry, ErrorClass: jobs.ClassTransient, Error: "429", RetryDelay: 10 * time.Second}
		}, jobs.StateFailedTerminal, jobs.ClassDeadline, jobs.AttemptFailed, "k.dead_lettered"},
		{"retry with no attempts left", jobs.EnqueueParams{MaxAttempts: 1}, func(j *jobs.Job) jobs.Completion {
			return jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
				Outcome: jobs.OutcomeRetry, ErrorClass: jobs.ClassTransient, Error: "timeout"}
		}, jobs.StateFailedTerminal, jobs.ClassTransient, jobs.AttemptFailed, "k.dead_lettered"},
		{"released", jobs.EnqueueParams{}, func(j *jobs.Job) jobs.Completion {
			return jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
				Outcome: jobs.OutcomeReleased, ErrorClass: jobs.ClassShutdown, Error: "shutting down"}
		}, jobs.StateRetryScheduled, jobs.ClassShutdown, jobs.AttemptReleased, ""},
		{"snoozed", jobs.EnqueueParams{}, func(j *jobs.Job) jobs.Completion {
			return jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
				Outcome: jobs.OutcomeSnoozed, Error: "breaker open", RetryDelay: time.Minute}
		}, jobs.StateRetryScheduled, "", jobs.AttemptSnoozed, ""},
	}
	for _, tt := range tests {
		enqueue(tt.params)
		j := f.claim(t, "w")
		before := len(f.events(t))
		// A heartbeat moves lease_until after the claim: the result
		// carries the column as the completion left it.
		_, err := f.store.Heartbeat(ctx, f.pool, "w", 2*time.Minute, []jobs.Lease{{JobID: j.ID, Fence: j.Fence}})
		require.NoError(t, err)
		c := tt.completion(j)
		out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c})
		require.NoError(t, err, tt.name)
		require.NoError(t, out[0].Err, tt.name)
		got := out[0].Apply(j, c)
		requireRecorded(t, f, got, tt.name)
		require.Equal(t, tt.state, got.State, tt.name)
		require.Equal(t, j.StateVersion+1, got.StateVersion, "%s: the transition bumps state_version", tt.name)
		require.Equal(t, j.Fence+1, got.Fence, "%s: the lease ended, so the fence moved", tt.name)
		require.Equal(t, tt.class, got.ErrorClass, tt.name)
		require.Equal(t, "w", got.LeaseOwner, "%s: the last lease holder is kept", tt.name)
		require.Equal(t, tt.state.Terminal(), !got.FinishedAt.IsZero(), tt.name)
		attempts, err := f.store.Attempts(ctx, f.pool, "acme", j.ID)
		require.NoError(t, err)
		require.Equal(t, tt.attempt, attempts[0].Outcome, tt.name)
		require.False(t, attempts[0].EndedAt.IsZero(), tt.name)
		events := f.events(t)
		if tt.event == "" {
			require.Len(t, events, before, "%s: no event for a release or a snooze", tt.name)
		} else {
			require.Equal(t, tt.event, events[len(events)-1].eventType, tt.name)
		}
		if tt.state == jobs.StateRetryScheduled {
			// Move it out of the way of the next claim.
			_, err := f.store.Cancel(ctx, f.pool, "acme", j.ID)
			require.NoError(t, err)
		}
	}
}

func TestDeadlinesAndReplay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", DeadlineAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	f.setState(t, res.Job.ID, "deadline_at = now() - interval '1 second'")

	_, err = f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 10, LeaseDuration: time.Minute})
	require.NoError(t, err)
	job, err := f.store.Get(ctx, f.pool, "acme", res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateReady, job.State, "a job past its deadline is never claimed")

	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.DeadlineFail)
	job, err = f.store.Get(ctx, f.pool, "acme", res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Equal(t, jobs.ClassDeadline, job.ErrorClass)

	before := f.rawJob(t, job.ID)
	res2, err := f.store.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: "acme", JobID: job.ID, By: "ops@acme", Reason: "provider outage"})
	require.NoError(t, err)
	require.False(t, res2.Existing)
	replay := res2.Job
	require.Equal(t, job.ID, replay.ReplayOf)
	require.Equal(t, "ops@acme", replay.ReplayedBy)
	require.Equal(t, "provider outage", replay.ReplayReason)
	require.Equal(t, jobs.StateReady, replay.State)
	require.JSONEq(t, string(job.Payload), string(replay.Payload))
	require.True(t, replay.DeadlineAt.IsZero(), "the passed deadline is not copied")
	require.Equal(t, before, f.rawJob(t, job.ID), "the dead job is byte-for-byte unchanged")

	_, err = f.store.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: "globex", JobID: job.ID, By: "x", Reason: "y"})
	require.ErrorIs(t, err, jobs.ErrNotFound)
	_, err = f.store.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: "acme", JobID: replay.ID, By: "x", Reason: "y"})
	require.ErrorIs(t, err, jobs.ErrNotReplayable, "a live job is not replayed")
	_, err = f.store.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: "acme", JobID: job.ID, By: "", Reason: "y"})
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
}

func TestReapFailsWhenAttemptsAreUsedUp(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", MaxAttempts: 1})
	require.NoError(t, err)
	j := f.claim(t, "w")
	f.expireLease(t, j.ID)
	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.LeaseFailed)
	got, err := f.store.Get(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateFailedTerminal, got.State)
	require.Equal(t, jobs.ClassLeaseExpired, got.ErrorClass)
	require.Equal(t, int64(2), got.Fence, "the fence moved: the lost worker cannot complete")
	events := f.events(t)
	require.Equal(t, "k.dead_lettered", events[len(events)-1].eventType)
}

// Leases lists a worker's RUNNING jobs in one queue: not another worker's,
// not a finished one, not another queue's.
func TestLeasesListsAWorkersRunningJobs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	queued := jobs.EnqueueParams{Tenant: "acme", Kind: "k"}
	webhook := jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: "webhooks"}
	_, err := f.store.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{queued, queued, queued, webhook})
	require.NoError(t, err)
	mine, done := f.claim(t, "w"), f.claim(t, "w")
	f.claim(t, "other")
	_, err = f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "webhooks", Kinds: []string{"k"}, Worker: "w", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	_, err = f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(done, `{}`)})
	require.NoError(t, err)

	held, err := f.store.Leases(ctx, f.pool, "w", "default")
	require.NoError(t, err)
	require.Len(t, held, 1)
	require.Equal(t, mine.ID, held[0].ID)
	require.Equal(t, mine.Fence, held[0].Fence)

	_, err = f.store.Leases(ctx, f.pool, "", "default")
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
	_, err = f.store.Leases(ctx, f.pool, "w", "")
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
}

// A replay is idempotent per dead job: replaying it again, even from many
// callers at once, returns the first replay and writes nothing; Again
// creates another job on purpose.
func TestReplayIsIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t, dbtest.Options{MaxConns: 8})
	ctx := t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", MaxAttempts: 1})
	require.NoError(t, err)
	j := f.claim(t, "w")
	_, err = f.store.Complete(ctx, f.pool, []jobs.Completion{{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: 1, Worker: "w", Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassPermanent, Error: "boom"}})
	require.NoError(t, err)
	eventsBefore := f.eventCount(t)

	params := jobs.ReplayParams{Tenant: "acme", JobID: res.Job.ID, By: "alice", Reason: "parser fixed"}
	results := make([]jobs.ReplayResult, 6)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r, err := f.store.Replay(ctx, f.pool, params)
			assert.NoError(t, err)
			results[i] = r
		})
	}
	wg.Wait()
	first := 0
	for _, r := range results {
		require.NotNil(t, r.Job)
		require.Equal(t, results[0].Job.ID, r.Job.ID, "every replay returns the same job")
		require.Equal(t, res.Job.ID, r.Job.ReplayOf)
		if !r.Existing {
			first++
		}
	}
	require.Equal(t, 1, first, "exactly one call created the replay")
	require.Equal(t, eventsBefore+1, f.eventCount(t), "one requested event")
	require.Equal(t, 2, f.count(t, "jobs"))

	params.By, params.Reason = "bob", "clicked twice"
	again, err := f.store.Replay(ctx, f.pool, params)
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, results[0].Job.ID, again.Job.ID)
	require.Equal(t, "alice", again.Job.ReplayedBy, "the first replay is returned as it was")

	params.Again = true
	second, err := f.store.Replay(ctx, f.pool, params)
	require.NoError(t, err)
	require.False(t, second.Existing)
	require.NotEqual(t, results[0].Job.ID, second.Job.ID, "Again creates another job")
	require.Equal(t, res.Job.ID, second.Job.ReplayOf)
	require.Equal(t, "bob", second.Job.ReplayedBy)
	require.Equal(t, 3, f.count(t, "jobs"))

	params.Again = false
	after, err := f.store.Replay(ctx, f.pool, params)
	require.NoError(t, err)
	require.True(t, after.Existing)
	require.Equal(t, results[0].Job.ID, after.Job.ID, "a plain replay still returns the first")

	// The replay key is the store's own: a tenant cannot send one like it.
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", IdempotencyKey: "\x1freplay " + res.Job.ID.String()})
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
}

// A heartbeat only moves lease_until, which no index holds, and the jobs
// table leaves room on its pages: the update is heap-only, writing no index
// entry (each running job heartbeats every interval, so this is most of
// what a long job writes). Counted by PostgreSQL for the transaction.
func TestHeartbeatIsHeapOnly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	j := f.claim(t, "w")

	// The counts are the session's not yet reported to the statistics
	// (earlier transactions' too), so the heartbeat's are the difference.
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	counts := func() (updated, hot int64) {
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)
			FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = 'jobs'`, f.schema).Scan(&updated, &hot))
		return updated, hot
	}
	updated0, hot0 := counts()
	res, err := f.store.Heartbeat(ctx, tx, "w", time.Minute, []jobs.Lease{{JobID: j.ID, Fence: j.Fence}})
	require.NoError(t, err)
	require.True(t, res.Kept[j.ID])
	updated, hot := counts()
	require.Equal(t, int64(1), updated-updated0)
	require.Equal(t, int64(1), hot-hot0, "the heartbeat is a heap-only update")
}

// A runner's heartbeat and its completions lock the same job rows. Each
// sends its jobs in id order, whatever order its caller gave them, so the
// two lock rows in one order and never deadlock (PostgreSQL would abort one
// of them after deadlock_timeout, holding both up for a second). Here they
// are given opposite orders, and run at once, round after round.
func TestHeartbeatAndCompletionNeverDeadlock(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	const n = 200
	params := make([]jobs.EnqueueParams, n)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`)}
	}
	for round := range 10 {
		_, err := f.store.EnqueueMany(ctx, f.pool, params)
		require.NoError(t, err)
		claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{
			Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: n, LeaseDuration: time.Minute,
		})
		require.NoError(t, err)
		require.Len(t, claimed, n)
		rand.Shuffle(len(claimed), func(i, j int) { claimed[i], claimed[j] = claimed[j], claimed[i] })
		leases := make([]jobs.Lease, n)
		completions := make([]jobs.Completion, n)
		for i, j := range claimed {
			leases[i] = jobs.Lease{JobID: j.ID, Fence: j.Fence}
			completions[n-1-i] = succeeded(j, `{}`)
		}
		var wg sync.WaitGroup
		var hbErr, completeErr error
		var results []jobs.CompletionResult
		wg.Go(func() { _, hbErr = f.store.Heartbeat(ctx, f.pool, "w", time.Minute, leases) })
		wg.Go(func() { results, completeErr = f.store.Complete(ctx, f.pool, completions) })
		wg.Wait()
		require.NoError(t, hbErr, "round %d", round)
		require.NoError(t, completeErr, "round %d", round)
		for i, r := range results {
			require.NoError(t, r.Err)
			require.Equal(t, completions[i].JobID, r.JobID, "results stay in input order")
		}
	}
}

// Move hands a held job to another queue under its fence: runnable there
// at once, its attempt recorded as snoozed with the reason and not counted
// against MaxAttempts, its tenant active in the new queue. A stale fence
// moves nothing; a queue the store does not know is refused naming it.
func TestMoveHandsAJobToAnotherQueue(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	enqueued, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", MaxAttempts: 3})
	require.NoError(t, err)
	held := f.claim(t, "batcher")
	require.Equal(t, enqueued.Job.ID, held.ID)

	_, err = f.store.Move(ctx, f.pool, jobs.MoveParams{Lease: jobs.Lease{JobID: held.ID, Fence: held.Fence}, Worker: "batcher", Queue: "nowhere", Reason: "r"})
	var bad *llmqtype.ValidationError
	require.ErrorAs(t, err, &bad)
	require.Equal(t, "Queue", bad.Field)
	require.ErrorIs(t, err, jobs.ErrUnknownQueue)
	_, err = f.store.Move(ctx, f.pool, jobs.MoveParams{Lease: jobs.Lease{JobID: held.ID, Fence: held.Fence + 1}, Worker: "batcher", Queue: "webhooks", Reason: "r"})
	require.ErrorIs(t, err, jobs.ErrLeaseLost, "a stale fence moves nothing")

	moved, err := f.store.Move(ctx, f.pool, jobs.MoveParams{
		Lease: jobs.Lease{JobID: held.ID, Fence: held.Fence}, Worker: "batcher", Queue: "webhooks", Reason: "its deadline leaves no room for a batch",
	})
	require.NoError(t, err)
	require.Equal(t, "webhooks", moved.Queue)
	require.Equal(t, jobs.StateRetryScheduled, moved.State)
	require.Equal(t, 4, moved.MaxAttempts, "the attempt is not counted")
	require.Greater(t, moved.Fence, held.Fence)
	_, err = f.store.Move(ctx, f.pool, jobs.MoveParams{Lease: jobs.Lease{JobID: held.ID, Fence: held.Fence}, Worker: "batcher", Queue: "webhooks", Reason: "again"})
	require.ErrorIs(t, err, jobs.ErrLeaseLost, "moved once")

	attempts, err := f.store.Attempts(ctx, f.pool, "acme", held.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptSnoozed, attempts[0].Outcome)
	require.Equal(t, "batcher", attempts[0].Worker)
	require.Equal(t, "its deadline leaves no room for a batch", attempts[0].Error)

	again, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "webhooks", Kinds: []string{"k"}, Worker: "runner", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, again, 1, "a runner of the new queue claims it at once")
	require.Equal(t, held.ID, again[0].ID)
	require.Equal(t, 2, again[0].Attempt)
	none, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "runner", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Empty(t, none, "gone from the old queue")
}

// requireRecorded checks that got, a completion's result laid over the job
// as claimed (CompletionResult.Apply), is the job as the store now holds
// it. The result is compared as JSON: jsonb keeps it in its own spacing.
func requireRecorded(t *testing.T, f *fixture, got *jobs.Job, name string) {
	t.Helper()
	stored, err := f.store.Get(t.Context(), f.pool, got.Tenant, got.ID)
	require.NoError(t, err, name)
	if len(stored.Result) > 0 || len(got.Result) > 0 {
		require.JSONEq(t, string(stored.Result), string(got.Result), name)
	}
	want, have := *stored, *got
	want.Result, have.Result = nil, nil
	require.Equal(t, want, have, "%s: Apply gives the job as recorded", name)
}

// A client's cancel request while the attempt runs is in what the
// completion returns, and a completion that sends no result keeps the
// job's own.
func TestCompletionResultApply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	claimOne := func() *jobs.Job {
		_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
		require.NoError(t, err)
		return f.claim(t, "w")
	}
	j := claimOne()
	_, err := f.store.Cancel(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	c := succeeded(j, `{"done": true}`)
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	got := out[0].Apply(j, c)
	require.False(t, got.CancelRequested.IsZero())
	require.Equal(t, j.StateVersion+2, got.StateVersion, "the cancel request and the completion")
	requireRecorded(t, f, got, "cancel requested")

	j = claimOne()
	c = jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w",
		Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassPermanent, Error: "400"}
	out, err = f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	requireRecorded(t, f, out[0].Apply(j, c), "no result sent")
}
