package jobs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// Tenant limits are data: a weight for the tenant's share of each queue and
// a cap on its running jobs, applied by the next claim. Here a claim of 6
// jobs with two backlogged tenants of weights 2 and 1 gives 4 to the first
// and 2 to the second.
func ExamplePostgresStore_SetTenantLimits() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_fair")
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_fair"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_fair"})
	if err != nil {
		panic(err)
	}
	if err := store.SetTenantLimits(ctx, pool, "acme", jobs.TenantLimits{Weight: 2, MaxRunning: 50}); err != nil {
		panic(err)
	}
	var backlog []jobs.EnqueueParams
	for range 10 {
		backlog = append(backlog,
			jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract"},
			jobs.EnqueueParams{Tenant: "globex", Kind: "invoice.extract"})
	}
	if _, err := store.EnqueueMany(ctx, pool, backlog); err != nil {
		panic(err)
	}

	claimed, err := store.Claim(ctx, pool, jobs.ClaimParams{
		Queue: jobs.DefaultQueue, Kinds: []string{"invoice.extract"}, Worker: "example", Limit: 6, LeaseDuration: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	perTenant := map[string]int{}
	for _, job := range claimed {
		perTenant[job.Tenant]++
	}
	fmt.Println("acme:", perTenant["acme"], "globex:", perTenant["globex"])

	limits, err := store.TenantLimitsOf(ctx, pool, "globex")
	if err != nil {
		panic(err)
	}
	fmt.Printf("globex has the defaults: %+v\n", limits)
	// Output:
	// acme: 4 globex: 2
	// globex has the defaults: {Weight:1 MaxRunning:0}
}
