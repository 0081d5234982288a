package jobs_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// Operators find any tenant's job by id; a missing id is ErrNotFound.
func TestLookup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "globex", Kind: "k"})
	require.NoError(t, err)

	job, err := f.store.Lookup(t.Context(), f.pool, res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, "globex", job.Tenant)
	require.Equal(t, res.Job.ID, job.ID)

	_, err = f.store.Lookup(t.Context(), f.pool, uuid.New())
	require.ErrorIs(t, err, jobs.ErrNotFound)
}

// DeadLetters lists FAILED_TERMINAL jobs of every tenant, latest first,
// and nothing else.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	var dead []uuid.UUID
	for _, tenant := range []string{"acme", "globex", "acme"} {
		res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "k"})
		require.NoError(t, err)
		// Distinct finish times, so the order is the finish order.
		f.setState(t, res.Job.ID, "state = 'FAILED_TERMINAL', finished_at = now() + interval '1 second' * "+
			[]string{"1", "2", "3"}[len(dead)])
		dead = append(dead, res.Job.ID)
	}
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)

	got, err := f.store.DeadLetters(ctx, f.pool, 10)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, []uuid.UUID{dead[2], dead[1], dead[0]}, []uuid.UUID{got[0].ID, got[1].ID, got[2].ID})
	got, err = f.store.DeadLetters(ctx, f.pool, 1)
	require.NoError(t, err)
	require.Len(t, got, 1)

	for _, limit := range []int{0, -1, jobs.MaxListLimit + 1} {
		_, err := f.store.DeadLetters(ctx, f.pool, limit)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, limit)
	}
}

// TenantBacklogs counts each tenant's runnable, scheduled and running jobs
// per queue, leaves finished work and finished tenants out, and reports
// the limits that apply: the tenant's own, else the defaults.
func TestTenantBacklogs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	enqueue := func(p jobs.EnqueueParams) uuid.UUID {
		res, err := f.store.Enqueue(ctx, f.pool, p)
		require.NoError(t, err)
		return res.Job.ID
	}
	enqueue(jobs.EnqueueParams{Tenant: "globex", Kind: "k"})
	f.claim(t, "w1")
	enqueue(jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	enqueue(jobs.EnqueueParams{Tenant: "acme", Kind: "k", AvailableAt: time.Now().Add(time.Hour)})
	enqueue(jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: "webhooks"})
	f.setState(t, enqueue(jobs.EnqueueParams{Tenant: "acme", Kind: "k"}), "state = 'SUCCEEDED', finished_at = now()")
	f.setState(t, enqueue(jobs.EnqueueParams{Tenant: "initech", Kind: "k"}), "state = 'CANCELLED', finished_at = now()")
	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "acme", jobs.TenantLimits{Weight: 4, MaxRunning: 2}))
	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "", jobs.TenantLimits{Weight: 1, MaxRunning: 9}))

	got, err := f.store.TenantBacklogs(ctx, f.pool)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Positive(t, got[0].OldestRunnableAge)
	got[0].OldestRunnableAge, got[2].OldestRunnableAge = 0, 0
	require.Equal(t, []jobs.TenantBacklog{
		{Queue: "default", Tenant: "acme", Runnable: 1, Scheduled: 1, Limits: jobs.TenantLimits{Weight: 4, MaxRunning: 2}, OwnLimits: true},
		{Queue: "default", Tenant: "globex", Running: 1, Limits: jobs.TenantLimits{Weight: 1, MaxRunning: 9}},
		{Queue: "webhooks", Tenant: "acme", Runnable: 1, Limits: jobs.TenantLimits{Weight: 4, MaxRunning: 2}, OwnLimits: true},
	}, got)
}

// AllTenantLimits returns the defaults under "" and every tenant's own.
func TestAllTenantLimits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	got, err := f.store.AllTenantLimits(ctx, f.pool)
	require.NoError(t, err)
	require.Equal(t, map[string]jobs.TenantLimits{"": {Weight: 1}}, got)

	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "acme", jobs.TenantLimits{Weight: 3, MaxRunning: 7}))
	got, err = f.store.AllTenantLimits(ctx, f.pool)
	require.NoError(t, err)
	require.Equal(t, map[string]jobs.TenantLimits{"": {Weight: 1}, "acme": {Weight: 3, MaxRunning: 7}}, got)
}
