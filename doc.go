// Package llmq is an embeddable library for durable LLM jobs: slow, costly,
// rate-limited model work that a Go service accepts at once and runs safely.
//
// PostgreSQL is the authority for job state. A host service enqueues jobs in
// its own transactions, workers hold fenced leases so a stale worker never
// overwrites a newer result, and results leave through a transactional
// outbox. The packages, lowest first:
//
//	internal/...   shared plumbing (SQL seam, migrations, retry math, test harness)
//	outbox         the outbox writer (and, later, the relay)
//	jobs           acceptance with idempotency, the state machine, fenced transitions
//	lease          the runner: claims, heartbeats, retries, reaper, shutdown
//
// This root package only migrates the schema. Call Migrate at start-up from
// every replica; it is safe to run concurrently:
//
//	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{}); err != nil {
//		return err
//	}
//
// Every llmq table lives in one Postgres schema ("llmq" unless
// MigrateOptions.Schema says otherwise); the host's own schemas, public
// included, are never touched. Teams that run their own migration tool can
// print the SQL with MigrationSQL (or `llmq migrate sql`) instead.
package llmq
