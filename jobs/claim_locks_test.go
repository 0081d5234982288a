package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

// claimAll claims up to 100 jobs of tenant acme's default queue on db.
func (f *fixture) claimAll(t *testing.T, db jobs.DBTX) []*jobs.Job {
	t.Helper()
	claimed, err := f.store.Claim(t.Context(), db, jobs.ClaimParams{
		Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 100, LeaseDuration: time.Minute,
	})
	require.NoError(t, err)
	return claimed
}

// A cancel committing while a lock-free claim waits for its job's row
// wins: the claim checks the row again as the cancel left it, and does
// not run a cancelled job.
func TestClaimWaitingForACancelSkipsWhatItCancelled(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)

	cancel, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = cancel.Rollback(context.Background()) }()
	_, err = f.store.Cancel(ctx, cancel, "acme", res.Job.ID)
	require.NoError(t, err)
	var cancelPID int32
	require.NoError(t, cancel.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&cancelPID))

	// Long enough that the claim waits for the cancel and does not give up
	// on it (see TestAJobHeldElsewhereHoldsBackOnlyThatJob).
	f.store.SetClaimLockTimeoutForTest(time.Minute)
	done := make(chan []*jobs.Job, 1)
	go func() {
		claimed, err := f.store.Claim(context.Background(), f.pool, jobs.ClaimParams{
			Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 10, LeaseDuration: time.Minute,
		})
		if err != nil {
			t.Errorf("the claim: %v", err)
		}
		done <- claimed
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, f.pool.QueryRow(ctx,
			"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))", cancelPID).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the claim waits for the cancel's row")
	require.NoError(t, cancel.Commit(ctx))

	require.Empty(t, <-done, "the cancelled job is not claimed")
	got, err := f.store.Get(ctx, f.pool, "acme", res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateCancelled, got.State)
	require.Zero(t, got.Attempt)
}

// A session of someone else's holding a waiting job's row (an operator's
// open transaction) holds back that job and nothing else: the lock-free
// claim gives up waiting for the row within its lock timeout, and claims
// skip locked rows from then on. A claim inside the caller's transaction
// skips locked rows from the start, and leaves that transaction usable.
func TestAJobHeldElsewhereHoldsBackOnlyThatJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	var ids []uuid.UUID
	for range 6 {
		res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
		require.NoError(t, err)
		ids = append(ids, res.Job.ID)
	}
	operator, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = operator.Rollback(context.Background()) }()
	_, err = operator.Exec(ctx, "SELECT FROM "+f.schema+".jobs WHERE id = ANY ($1) FOR UPDATE", dbsql.UUIDs([]uuid.UUID{ids[0], ids[3]}))
	require.NoError(t, err)

	caller, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = caller.Rollback(context.Background()) }()
	nested := f.claimAll(t, caller)
	require.Len(t, nested, 4, "a claim in the caller's transaction steps over the held jobs")
	var n int
	require.NoError(t, caller.QueryRow(ctx, "SELECT count(*) FROM "+f.schema+".jobs WHERE state = 'RUNNING'").Scan(&n))
	require.Equal(t, 4, n, "and the caller's transaction goes on")
	require.NoError(t, caller.Rollback(ctx))

	// A new store claims lock-free first.
	f.store, err = jobs.NewStore(f.store.Config())
	require.NoError(t, err)
	start := time.Now()
	claimed := f.claimAll(t, f.pool)
	require.Len(t, claimed, 4, "everything but the held jobs")
	require.Less(t, time.Since(start), 5*time.Second, "the claim gave up waiting for the held rows")
	for _, j := range claimed {
		require.NotContains(t, []uuid.UUID{ids[0], ids[3]}, j.ID)
	}

	require.NoError(t, operator.Rollback(ctx))
	// The claim took some of what it was offered, so the tenant stayed
	// active and the next claim finds the freed jobs.
	claimed = f.claimAll(t, f.pool)
	require.Len(t, claimed, 2, "once the rows are free, their jobs are claimed")
}

// A tenant stays active while claims find work for it, and is marked idle
// by the first claim that finds none: an enqueue for a tenant being served
// writes no tenant row, so concurrent enqueuers and claims of one tenant do
// not queue behind each other's commits. Here a transaction holding the
// tenant's row stands for them: the enqueue, under a lock timeout, must not
// wait for it.
func TestATenantStaysActiveUntilAClaimFindsItEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	idle := func() bool {
		t.Helper()
		var idle bool
		require.NoError(t, f.pool.QueryRow(ctx,
			"SELECT idle FROM "+f.schema+".tenant_queues WHERE queue = 'default' AND tenant = 'acme'").Scan(&idle))
		return idle
	}
	for range 2 {
		_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
		require.NoError(t, err)
	}
	require.Len(t, f.claimAll(t, f.pool), 2)
	require.False(t, idle(), "a claim that took fewer jobs than it was offered, but some, leaves the tenant active")

	holder, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(ctx, "SELECT FROM "+f.schema+".tenant_queues WHERE tenant = 'acme' FOR UPDATE")
	require.NoError(t, err)
	enqueue, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = enqueue.Rollback(context.Background()) }()
	_, err = enqueue.Exec(ctx, "SET LOCAL lock_timeout = '100ms'")
	require.NoError(t, err)
	_, err = f.store.Enqueue(ctx, enqueue, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err, "the enqueue for an active tenant does not wait for its row")
	require.NoError(t, enqueue.Commit(ctx))
	require.NoError(t, holder.Rollback(ctx))

	require.Len(t, f.claimAll(t, f.pool), 1)
	require.False(t, idle())
	require.Empty(t, f.claimAll(t, f.pool))
	require.True(t, idle(), "the claim that found nothing marks the tenant idle")

	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	require.False(t, idle(), "new work makes it active again")
	require.Len(t, f.claimAll(t, f.pool), 1)
}
