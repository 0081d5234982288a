// Package llmq is an embeddable library for durable LLM jobs: slow, costly,
// rate-limited model work that a Go service accepts at once and runs safely.
//
// PostgreSQL is the authority for job state. A host service enqueues jobs in
// its own transactions, workers hold fenced leases so a stale worker never
// overwrites a newer result, an admission limiter keeps every process
// within the provider's shared quota, and results leave through a
// transactional outbox, brokers and signed webhooks. The packages, lowest
// first (each imports only packages above it):
//
//	broker              the broker-neutral contract: Message, Publisher, Consumer, Delivery
//	broker/memory       an in-process broker, for tests and single-process hosts
//	broker/rabbitmq     the RabbitMQ adapter (amqp091-go)
//	broker/kafka        the Kafka adapter (franz-go)
//	outbox              the outbox writer and the relay that publishes committed events
//	inbox               the durable inbox and the broker ingress that acks after commit
//	jobs                acceptance with idempotency, the state machine, fenced transitions, replay
//	admission           the RPM/TPM/in-flight limiter and tenant acceptance quotas
//	lease               the runner: claims, heartbeats, deadlines, retries, reaper, shutdown, model routes
//	schedule            periodic jobs: one job per slot across the fleet under a fenced scheduler lease
//	webhook             signed delivery to registered endpoints and the receiver helper
//	retention           what is kept how long, and the leased service that prunes the rest
//	provider/openai     openai-go adapter: SDK retries off, usage and rate limits to the attempt, failures classified
//	provider/anthropic  the same for anthropic-sdk-go
//	llmqtest            helpers for hosts' tests: pooled migrated schemas, work a queue, assert enqueues
//	cmd/llmq            the operator CLI
//	examples/...        runnable programs wiring the packages into servers
//
// Any of them may also import internal/..., the plumbing they share
// (schema names and SQL files, migrations, backoff, field errors, LISTEN,
// leader-lease renewal, telemetry, test schemas); the two provider adapters share
// provider/internal/... as well. No host imports either.
//
// Each package's doc.go states what it guarantees. This root package
// migrates the schema and names the release (Version). Call Migrate at
// start-up from every replica; it is safe to run concurrently:
//
//	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{}); err != nil {
//		return err
//	}
//
// Every llmq table lives in one Postgres schema ("llmq" unless
// MigrateOptions.Schema says otherwise); the host's own schemas, public
// included, are never touched. Teams that run their own migration tool can
// print the SQL with MigrationSQL (or `llmq migrate sql`) instead.
//
// A process that runs a runner, a relay, an ingress and a limiter needs
// one pool of 4 connections for them, and holds 2 more for LISTEN
// (docs/operations.md, "Database connections").
//
// The README is a short guide; docs/ holds the usage of each component
// (usage.md), the design and its contracts (design.md), operations
// (operations.md) and every measured figure (performance.md).
package llmq
