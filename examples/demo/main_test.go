package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/llmqtest"
)

// TestMain fails the tests if any goroutine the stack started (runners,
// relays, ingresses, dispatchers, servers) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The demo runs to the end with its invariants holding, on a smaller batch.
func TestDemoRuns(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t, llmqtest.Options{MaxConns: 20})
	require.NoError(t, run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 30, Small: 4,
		Scale: 300, RPM: 3000, Workers: 8, Outage: 2 * time.Second, Timeout: 60 * time.Second, Broker: "memory",
	}))
}

// With RabbitMQ carrying the job events.
func TestDemoRunsWithRabbitMQ(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t, llmqtest.Options{MaxConns: 20})
	amqpURL := os.Getenv("AMQP_URL")
	if amqpURL == "" {
		amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	require.NoError(t, run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 10, Small: 6,
		Scale: 300, RPM: 3000, Workers: 8, Outage: time.Second, Timeout: 60 * time.Second,
		Broker: "rabbitmq", AMQPURL: amqpURL,
	}))
}

// With Kafka (an in-process kfake cluster, or KAFKA_BROKERS) carrying the
// job events and waking the workers.
func TestDemoRunsWithKafka(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t, llmqtest.Options{MaxConns: 20})
	require.NoError(t, run(t.Context(), options{
		DatabaseURL: llmqtest.URL(), Schema: db.Schema, Invoices: 10, Small: 6,
		Scale: 300, RPM: 3000, Workers: 8, Outage: time.Second, Timeout: 60 * time.Second,
		Broker: "kafka",
	}))
}
