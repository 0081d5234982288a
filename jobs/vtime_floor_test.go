package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// A tenant that becomes active starts from the lowest virtual time among
// the queue's active tenants, never from a lower one of its own, so that
// time spent idle banks no credit over tenants that kept working. Every
// statement that activates a tenant applies that floor: an enqueue (a new
// tenant, an idle one, several in one batch), a completion that frees an
// idle tenant, and the sweep of idle tenants with work. The enqueue reads
// it inline and the other two through active_vtime_floor, so this test is
// also what keeps the two definitions alike.
func TestATenantBecomingActiveStartsAtTheQueuesFloor(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	enqueue := func(queue string, tenants ...string) {
		t.Helper()
		params := make([]jobs.EnqueueParams, len(tenants))
		for i, tenant := range tenants {
			params[i] = jobs.EnqueueParams{Tenant: tenant, Kind: "k", Queue: queue}
		}
		_, err := f.store.EnqueueMany(ctx, f.pool, params)
		require.NoError(t, err)
	}
	set := func(tenant string, idle bool, vtime float64) {
		t.Helper()
		_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".tenant_queues SET idle = $2, vtime = $3 WHERE queue = 'default' AND tenant = $1",
			tenant, idle, vtime)
		require.NoError(t, err)
	}
	vtime := func(queue, tenant string) float64 {
		t.Helper()
		var v float64
		var idle bool
		require.NoError(t, f.pool.QueryRow(ctx, "SELECT vtime, idle FROM "+f.schema+".tenant_queues WHERE queue = $1 AND tenant = $2",
			queue, tenant).Scan(&v, &idle))
		require.False(t, idle, "tenant %s of %s is active", tenant, queue)
		return v
	}

	// Claimed while alone, so the claim's charge lands on it only; then
	// made idle with an old, low virtual time.
	enqueue("default", "returning")
	claimed := f.claimAll(t, f.pool)
	require.Len(t, claimed, 1)
	enqueue("default", "ahead", "swept", "back")
	set("ahead", false, 7)
	set("returning", true, 1)
	set("swept", true, 2)
	set("back", true, 1)

	enqueue("default", "new")
	require.InDelta(t, 7, vtime("default", "new"), 1e-9, "a new tenant starts at the floor")
	enqueue("default", "back")
	require.InDelta(t, 7, vtime("default", "back"), 1e-9, "an idle tenant returns at the floor")
	enqueue("default", "first", "second")
	require.InDelta(t, 7, vtime("default", "first"), 1e-9, "the floor is the same for every tenant of a batch")
	require.InDelta(t, 7, vtime("default", "second"), 1e-9)
	enqueue("webhooks", "alone")
	require.Zero(t, vtime("webhooks", "alone"), "a queue without active tenants starts its first at 0")

	_, err := f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(claimed[0], `{}`)})
	require.NoError(t, err)
	require.InDelta(t, 7, vtime("default", "returning"), 1e-9, "a completion wakes an idle tenant at the floor")

	woken, err := f.store.WakeIdleTenants(ctx, f.pool, "default", 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, woken, "only the idle tenant with work is woken")
	require.InDelta(t, 7, vtime("default", "swept"), 1e-9, "the sweep wakes an idle tenant at the floor")

	set("ahead", false, 3)
	set("back", false, 9)
	enqueue("default", "ahead")
	require.InDelta(t, 3, vtime("default", "ahead"), 1e-9, "an active tenant keeps its own virtual time")
}
