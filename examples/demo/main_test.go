package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/llmqtest"
)

// TestMain fails the tests if any goroutine the stack started (runners,
// relays, ingresses, dispatchers, servers) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The demo runs to the end with its invariants holding, on a smaller batch,
// and pays for each distinct document once: its malformed answer and its
// hung call are the faults' calls, and its three repeated documents take
// their results.
func TestDemoRuns(t *testing.T) {
	t.Parallel()
	db := freshSchema(t)
	b, err := run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 30, Small: 4,
		Scale: 300, RPM: 3000, Workers: 8, Outage: 2 * time.Second, Timeout: 60 * time.Second, Broker: "memory",
	})
	require.NoError(t, err)
	requirePaidOnce(t, b, 37)
	require.Equal(t, 1, b.FaultPaid, "big-0011's malformed answer")
	require.Positive(t, b.Unanswered, "big-0017's hung call")
}

// With a batch lane: the documents that can wait go through the fake
// provider's Batch API, are checked and delivered to the ERP as the
// others are, and cost half as much in the usage ledger (the demo fails
// otherwise).
func TestDemoRunsWithABatchLane(t *testing.T) {
	t.Parallel()
	db := freshSchema(t)
	b, err := run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 20, Small: 4, Deferrable: 12,
		Scale: 300, RPM: 3000, Workers: 8, Outage: time.Second, Timeout: 60 * time.Second, Broker: "none",
	})
	require.NoError(t, err)
	requirePaidOnce(t, b, 39)
}

// Against a simulated local inference server's engine, with the pool
// admitting by tokens in flight: the same invariants hold.
func TestDemoRunsAgainstALocalServer(t *testing.T) {
	t.Parallel()
	db := freshSchema(t)
	b, err := run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 20, Small: 4,
		Scale: 300, RPM: 3000, Workers: 8, Outage: time.Second, Timeout: 60 * time.Second, Broker: "memory",
		Provider: "local", KVTokens: 6000,
	})
	require.NoError(t, err)
	requirePaidOnce(t, b, 27)
}

// With RabbitMQ carrying the job events.
func TestDemoRunsWithRabbitMQ(t *testing.T) {
	t.Parallel()
	db := freshSchema(t)
	amqpURL := os.Getenv("AMQP_URL")
	if amqpURL == "" {
		amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	b, err := run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 10, Small: 6,
		Scale: 300, RPM: 3000, Workers: 8, Outage: time.Second, Timeout: 60 * time.Second,
		Broker: "rabbitmq", AMQPURL: amqpURL,
	})
	require.NoError(t, err)
	requirePaidOnce(t, b, 19)
}

// With Kafka (an in-process kfake cluster, or KAFKA_BROKERS) carrying the
// job events and waking the workers.
func TestDemoRunsWithKafka(t *testing.T) {
	t.Parallel()
	db := freshSchema(t)
	b, err := run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 10, Small: 6,
		Scale: 300, RPM: 3000, Workers: 8, Outage: time.Second, Timeout: 60 * time.Second,
		Broker: "kafka",
	})
	require.NoError(t, err)
	requirePaidOnce(t, b, 19)
}

// requirePaidOnce asserts the bill the demo's summary prints: its
// documents, three of them repeats that took their results, and paid calls
// (the provider's own records) = distinct documents + the calls the faults
// caused, each distinct document paid for once.
func requirePaidOnce(t *testing.T, b bill, documents int) {
	t.Helper()
	require.Equal(t, documents, b.Documents)
	require.Equal(t, 3, b.Repeats, "the plan uploads three documents again")
	require.Equal(t, documents-3, b.Distinct)
	require.Equal(t, b.Repeats, b.Reused, "every repeat took its result")
	require.Equal(t, b.Distinct+b.FaultPaid, b.Paid, "paid calls = distinct documents + the calls the faults caused")
	require.Equal(t, b.FaultPaid, b.InvalidOutput, "each fault-caused paid call is an attempt that ended with invalid output")
	require.Empty(t, b.PaidAgain)
	require.Zero(t, b.Strays)
	require.Equal(t, b.Distinct+b.faultCalls(), b.Calls, "every other call the provider served, a fault caused")
}

// testDB is a pool and a schema of the test's own.
type testDB struct {
	Pool   *pgxpool.Pool
	Schema string
}

// freshSchema reserves a schema name never used before, which the demo
// migrates itself, and drops it when the test ends. The demo's checks of
// its event stream count from the first event sequence number, so they
// need a new schema rather than one of llmqtest's reused ones, whose
// sequences carry on.
func freshSchema(t *testing.T) *testDB {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(llmqtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	db := &testDB{Pool: pool, Schema: "demo_" + hex.EncodeToString(suffix)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{db.Schema}.Sanitize()+" CASCADE")
		pool.Close()
		require.NoError(t, err)
	})
	return db
}
