package jobs_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// The fenced statements must probe the primary key once per job, whatever
// the number of RUNNING jobs: a plan driven from an index on RUNNING jobs
// (all running jobs, such as jobs_running_tenant_idx) made completions slower as concurrency grew. Generic plans,
// which a prepared statement ends up with, are where this went wrong, so
// that is what is checked.
func TestFencedStatementsProbeThePrimaryKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	// Enough rows, and tenants, that the planner's choice reflects a real
	// table; on a few hundred rows a sequential scan is legitimately
	// cheapest.
	params := make([]jobs.EnqueueParams, jobs.MaxBatch)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: fmt.Sprintf("tenant-%d", i), Kind: "k"}
	}
	for range 2 {
		_, err := f.store.EnqueueMany(ctx, f.pool, params)
		require.NoError(t, err)
	}
	claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 300, LeaseDuration: time.Minute})
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "ANALYZE "+f.schema+".jobs, "+f.schema+".job_keys, "+f.schema+".tenant_queues")
	require.NoError(t, err)

	require.NotEmpty(t, claimed)
	explain := func(name string) string {
		t.Helper()
		return dbtest.GenericPlan(t, f.pool, f.store.QueryForTest(name))
	}

	for _, name := range []string{"HeartbeatLeases", "CompleteJobs", "MarkHungAttempts", "MoveJob"} {
		plan := explain(name)
		require.Contains(t, plan, "jobs_pkey", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "jobs_running_tenant_idx", "%s:\n%s", name, plan)
	}

	// And the claim reads as many rows as it claims, whatever the backlog
	// or the number of tenants: it walks the active tenants in vtime order,
	// then each tenant's claim index, checks groups and caps through their
	// indexes, and updates by primary key. Nothing scans a table.
	plan := explain("LockClaimTenants")
	require.Contains(t, plan, "tenant_queues_vtime_idx", plan)
	require.Contains(t, plan, "jobs_running_tenant_idx", plan)
	require.NotContains(t, plan, "Seq Scan on tenant_queues", plan)
	require.NotContains(t, plan, "Seq Scan on jobs", plan)

	for _, name := range []string{"ClaimJobs", "ClaimJobsSkippingLocked"} {
		plan = explain(name)
		// Result reuse: a picked job's key probes the running and computed
		// jobs with a key (migration 0025).
		for _, index := range []string{"jobs_tenant_claim_idx", "jobs_group_idx", "jobs_running_tenant_idx", "jobs_pkey", "tenant_queues_pkey",
			"jobs_reuse_idx"} {
			require.Contains(t, plan, index, "%s:\n%s", name, plan)
		}
		require.NotContains(t, plan, "Seq Scan on jobs", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on tenant_queues", "%s:\n%s", name, plan)
	}

	// Enqueue's statement probes whether the job's tenant is active through
	// tenant_queues' primary key, not by walking every active tenant of the
	// queue, and writes nothing through a scan.
	plan = explain("InsertJob")
	require.Contains(t, plan, "tenant_queues_pkey", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
	require.NotContains(t, plan, "outbox_batches", plan)

	// The reads that moved to job_keys go through its indexes, then jobs'
	// primary key.
	for name, index := range map[string]string{
		"ListJobs":                   "job_keys_pkey",
		"SelectJobsByIdempotencyKey": "job_keys_idempotency_idx",
	} {
		plan := explain(name)
		require.Contains(t, plan, index, "%s:\n%s", name, plan)
		require.Contains(t, plan, "jobs_pkey", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", name, plan)
	}

	// The warning about unserved kinds reads idle tenants, then each one's
	// waiting jobs, through their indexes.
	plan = explain("UnservedKinds")
	require.Contains(t, plan, "jobs_tenant_claim_idx", plan)
	require.NotContains(t, plan, "Seq Scan on jobs", plan)

	// A runner's leases are read from the running jobs only.
	plan = explain("ListLeases")
	require.NotContains(t, plan, "Seq Scan", plan)
	require.Contains(t, plan, "jobs_running_tenant_idx", plan)

	// The reaper reads the running jobs, through their index; the deadline
	// sweep the waiting jobs with a deadline, through theirs.
	plan = explain("ReapExpiredLeases")
	require.Contains(t, plan, "jobs_running_tenant_idx", plan)
	require.NotContains(t, plan, "Seq Scan on jobs", plan)
	plan = explain("FailExpiredDeadlines")
	require.Contains(t, plan, "jobs_deadline_idx", plan)
	require.NotContains(t, plan, "Seq Scan on jobs", plan)

	// The operator's backlogs read the unfinished jobs through the claim
	// index and the running jobs' index, never the finished history. With
	// little history, reading the whole table is legitimately cheapest: 1,700
	// waiting jobs beside 200,000 finished ones make the index pay.
	_, err = f.pool.Exec(ctx, `INSERT INTO `+f.schema+`.jobs (id, tenant, kind, queue, payload, max_attempts, state, finished_at)
		SELECT gen_random_uuid(), 'tenant-' || (i % 100), 'k', 'default', '{}', 1, 'SUCCEEDED', now()
		FROM generate_series(1, 200000) AS i`)
	require.NoError(t, err)
	// Vacuumed, as autovacuum keeps a table with that much history.
	_, err = f.pool.Exec(ctx, "VACUUM ANALYZE "+f.schema+".jobs")
	require.NoError(t, err)
	for _, name := range []string{"TenantBacklogs", "KindBacklogs"} {
		plan = explain(name)
		require.Contains(t, plan, "jobs_tenant_claim_idx", "%s:\n%s", name, plan)
		require.Contains(t, plan, "jobs_running_tenant_idx", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on jobs", "%s:\n%s", name, plan)
	}
}

// A connection keeps a statement's plan until the table's statistics
// change, so the runner's statements must reach jobs by their keys however
// few rows the table held when they were planned: never analyzed (a new
// deployment), or vacuumed empty (a queue pruned empty while idle), where a
// scan of the table is the cheapest plan and stays the plan while a burst
// fills it. A claim runs after ClaimSettings, the fenced statements after
// KeyedPlans, in their round trip; both turn sequential scans off.
func TestRunnerPlansNeedNoScanOfAnEmptyTable(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	claimSettings := strings.NewReplacer("$1", "1000", "$2", "200").Replace(f.store.QueryForTest("ClaimSettings"))
	keyed := f.store.QueryForTest("KeyedPlans")
	// Each with its settings and the index it must read jobs through: with
	// sequential scans off on a table of no pages, any index is as cheap as
	// another to the planner, so the right one is checked too.
	statements := map[string]struct{ settings, index string }{
		"LockClaimTenants":        {claimSettings, "tenant_queues_vtime_idx"},
		"ClaimJobs":               {claimSettings, "jobs_tenant_claim_idx"},
		"ClaimJobsSkippingLocked": {claimSettings, "jobs_tenant_claim_idx"},
		"HeartbeatLeases":         {keyed, "jobs_pkey"},
		"CompleteJobs":            {keyed, "jobs_pkey"},
		"MarkHungAttempts":        {keyed, "jobs_pkey"},
	}
	// And every statement that updates jobs by id probes the primary key.
	probe := regexp.MustCompile(`(Index Scan using jobs_pkey on jobs \w+|Bitmap Index Scan on jobs_pkey)\s+Index Cond: \(id = ANY`)
	check := func(when string) {
		t.Helper()
		for name, s := range statements {
			plan := dbtest.GenericPlanAfter(t, f.pool, s.settings, f.store.QueryForTest(name))
			require.NotContains(t, plan, "Seq Scan", "%s, %s:\n%s", name, when, plan)
			require.Contains(t, plan, s.index, "%s, %s:\n%s", name, when, plan)
			if name != "LockClaimTenants" {
				require.Regexp(t, probe, plan, "%s, %s", name, when)
			}
			if strings.HasPrefix(name, "ClaimJobs") {
				// The low-priority share leaves out what the urgent one
				// took with one hash probe per row read.
				require.Contains(t, plan, "NOT (hashed SubPlan", "%s, %s:\n%s", name, when, plan)
			}
		}
	}
	check("on tables never analyzed")
	_, err := f.pool.Exec(ctx, "VACUUM ANALYZE "+f.schema+".jobs, "+f.schema+".tenant_queues, "+f.schema+".job_attempts, "+
		f.schema+".outbox, "+f.schema+".job_batches, "+f.schema+".tenant_limits")
	require.NoError(t, err)
	check("on tables vacuumed empty")
}
