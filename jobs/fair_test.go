package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

func TestShareOut(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		tenants [][4]float64 // vtime, weight, cap, running
		limit   int
		want    []int
	}{
		"equal weights split evenly":           {[][4]float64{{0, 1, 0, 0}, {0, 1, 0, 0}}, 6, []int{3, 3}},
		"weights 1:2":                          {[][4]float64{{0, 1, 0, 0}, {0, 2, 0, 0}}, 6, []int{2, 4}},
		"the tenant behind catches up first":   {[][4]float64{{5, 1, 0, 0}, {0, 1, 0, 0}}, 5, []int{0, 5}},
		"a cap stops the offer":                {[][4]float64{{0, 1, 5, 3}, {0, 1, 0, 0}}, 10, []int{2, 8}},
		"a tenant at its cap is offered none":  {[][4]float64{{0, 1, 5, 5}, {0, 1, 0, 0}}, 4, []int{0, 4}},
		"the batch may be larger than needed":  {[][4]float64{{0, 1, 2, 0}}, 10, []int{2}},
		"ties go in name order":                {[][4]float64{{0, 1, 0, 0}, {0, 1, 0, 0}}, 1, []int{1, 0}},
		"weights apply on top of virtual time": {[][4]float64{{1, 4, 0, 0}, {0, 1, 0, 0}}, 5, []int{4, 1}},
	}
	for name, tt := range tests {
		given, relaxed := jobs.ShareOutForTest(tt.tenants, tt.limit, 0)
		require.Equal(t, tt.want, given, name)
		require.Equal(t, make([]int, len(tt.tenants)), relaxed, name)
	}

	// The low-priority share is rounded at random, so its expectation is
	// exact whatever the batch size.
	total := 0
	for range 10_000 {
		given, relaxed := jobs.ShareOutForTest([][4]float64{{0, 1, 0, 0}}, 3, 0.1)
		require.Equal(t, []int{3}, given)
		require.LessOrEqual(t, relaxed[0], 1)
		total += relaxed[0]
	}
	require.InDelta(t, 3_000, total, 300, "0.1 of 30,000 jobs")
}

func TestTenantLimits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	l, err := f.store.TenantLimitsOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 1}, l, "the initial defaults")

	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "", jobs.TenantLimits{Weight: 3, MaxRunning: 7}))
	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "acme", jobs.TenantLimits{Weight: 2, MaxRunning: 5}))
	l, err = f.store.TenantLimitsOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 2, MaxRunning: 5}, l)
	l, err = f.store.TenantLimitsOf(ctx, f.pool, "globex")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 3, MaxRunning: 7}, l, "a tenant without limits of its own has the defaults")

	require.NoError(t, f.store.DeleteTenantLimits(ctx, f.pool, "acme"))
	l, err = f.store.TenantLimitsOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 3, MaxRunning: 7}, l)

	for field, bad := range map[string]jobs.TenantLimits{
		"Weight":     {Weight: 0},
		"MaxRunning": {Weight: 1, MaxRunning: -1},
	} {
		err := f.store.SetTenantLimits(ctx, f.pool, "acme", bad)
		require.ErrorIs(t, err, jobs.ErrInvalidParams)
		require.ErrorContains(t, err, field)
	}
	require.ErrorContains(t, f.store.SetTenantLimits(ctx, f.pool, "acme", jobs.TenantLimits{Weight: jobs.MaxTenantWeight + 1}), "use 1 to 1000")
	require.ErrorIs(t, f.store.DeleteTenantLimits(ctx, f.pool, ""), jobs.ErrInvalidParams, "the defaults cannot be deleted")
	_, err = f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: jobs.DefaultQueue, Kinds: []string{"k"}, Worker: "w", Limit: 1, LeaseDuration: 60e9, LowPriorityShare: 1.5})
	require.ErrorContains(t, err, "LowPriorityShare")
}
