package admission_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
)

// Pools lists every pool by name with its limits and current state: the
// permits held and the cooldown left.
func TestPools(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	pools, err := f.pg.Pools(ctx)
	require.NoError(t, err)
	require.Empty(t, pools)

	require.NoError(t, f.pg.SetPool(ctx, admission.Pool{Name: "b-pool", RPM: 60, TPM: 6000, MaxInFlight: 3, InputPrice: 7}))
	require.NoError(t, f.pg.SetPool(ctx, admission.Pool{Name: "a-pool", RPM: 600, TPM: 60000, MaxInFlight: 9}))
	_, err = f.pg.Acquire(ctx, admission.Request{Pool: "b-pool", Tokens: 100})
	require.NoError(t, err)
	require.NoError(t, f.pg.Cooldown(ctx, "b-pool", time.Minute))

	pools, err = f.pg.Pools(ctx)
	require.NoError(t, err)
	require.Len(t, pools, 2)
	require.Equal(t, "a-pool", pools[0].Name)
	require.Zero(t, pools[0].InFlight)
	require.Zero(t, pools[0].Cooldown)
	b := pools[1]
	require.Equal(t, admission.Pool{Name: "b-pool", RPM: 60, TPM: 6000, MaxInFlight: 3, RequestBurst: 1, TokenBurst: 600, InputPrice: 7}, b.Pool)
	require.Equal(t, 1, b.InFlight)
	require.Greater(t, b.Cooldown, 50*time.Second)
	state, err := f.pg.State(ctx, "b-pool")
	require.NoError(t, err)
	require.Equal(t, state.Pool, b.Pool, "Pools reads what State reads")
}

// Tenant quotas read back as set, list only tenants with their own, and
// delete back to the default.
func TestTenantQuotaReads(t *testing.T) {
	t.Parallel()
	f := setupQuotas(t, admission.QuotaConfig{Default: admission.TenantQuota{MaxPendingJobs: 5}})
	ctx := t.Context()
	_, own, err := f.quotas.TenantQuotaOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.False(t, own)

	acme := admission.TenantQuota{MaxPendingJobs: 100, MaxDailyCost: 2_500_000}
	require.NoError(t, f.quotas.SetTenantQuota(ctx, f.pool, "acme", acme))
	require.NoError(t, f.quotas.SetTenantQuota(ctx, f.pool, "globex", admission.TenantQuota{MaxPendingBytes: 1 << 20}))
	got, own, err := f.quotas.TenantQuotaOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.True(t, own)
	require.Equal(t, acme, got)
	all, err := f.quotas.TenantQuotas(ctx, f.pool)
	require.NoError(t, err)
	require.Equal(t, map[string]admission.TenantQuota{"acme": acme, "globex": {MaxPendingBytes: 1 << 20}}, all)

	require.NoError(t, f.quotas.DeleteTenantQuota(ctx, f.pool, "acme"))
	_, own, err = f.quotas.TenantQuotaOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.False(t, own)
	// The default applies again: the host's 5 pending jobs, not acme's 100.
	for range 5 {
		_, err := f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
		require.NoError(t, err)
	}
	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
	require.ErrorIs(t, err, admission.ErrOverQuota)

	for _, bad := range []string{strings.Repeat("x", admission.MaxTenantLen+1), "a\nb"} {
		_, _, err := f.quotas.TenantQuotaOf(ctx, f.pool, bad)
		require.ErrorIs(t, err, admission.ErrInvalid)
		require.ErrorIs(t, f.quotas.DeleteTenantQuota(ctx, f.pool, bad), admission.ErrInvalid)
	}
}
