package llmq_test

import (
	"context"
	"fmt"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
)

// Migrate at start-up from every replica: concurrent calls serialise on an
// advisory lock and each migration is applied once.
func ExampleMigrate() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_migrate") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()

	res, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_migrate"})
	if err != nil {
		panic(err)
	}
	for _, m := range res.Migrations {
		fmt.Printf("applied %04d_%s\n", m.Version, m.Name)
	}

	status, err := llmq.MigrationStatus(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_migrate"})
	if err != nil {
		panic(err)
	}
	fmt.Println("all applied:", status[len(status)-1].Applied())
	// Output:
	// applied 0001_init
	// applied 0002_inbox_relay
	// applied 0003_fair_claiming
	// applied 0004_webhook
	// applied 0005_admission
	// applied 0006_observability
	// applied 0007_outbox_fillfactor
	// applied 0008_job_keys
	// applied 0009_webhook_sealed_secrets
	// applied 0010_inbox_quarantine_raw
	// applied 0011_outbox_relay_lease
	// applied 0012_retention
	// applied 0013_jobs_fewer_indexes
	// applied 0014_job_events_flag
	// applied 0015_job_steps
	// applied 0016_job_batches
	// applied 0017_admission_in_flight_tokens
	// applied 0018_kvfeedback_lease
	// applied 0019_outbox_narrow_key_index
	// applied 0020_webhook_delivery_jobs
	// applied 0021_outbox_batches
	// applied 0022_outbox_batch_events_json
	// applied 0023_provider_batches
	// applied 0024_batch_prices
	// applied 0025_job_reuse
	// applied 0026_routes
	// applied 0027_schedules
	// applied 0028_outbox_batch_events_lz4
	// all applied: true
}
