package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
)

// The relay bench against Kafka (kfake, or KAFKA_BROKERS) reports the raw
// produce rate and the relay's, and checks every event reached the topic.
func TestBenchRelayKafka(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-mode", "relay", "-broker", "kafka", "-jobs", "300", "-workers", "2", "-claim-batch", "100")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `llmq bench: kafka \([^)]+\) raw produce: messages=300 publishers=2 batch=100 seconds=[0-9.]+ msgs_per_s=\d+`, stderr)
	require.Regexp(t, `llmq bench: kafka \([^)]+\) relay: events=300 relays=2 batch=100 seconds=[0-9.]+ events_per_s=\d+ \(\d+% of the raw produce rate\)`, stderr)
	require.Regexp(t, `^llmq relay jobs=300 workers=2 seconds=[0-9.]+ jobs_per_s=\d+\n$`, out)

	code, _, stderr = runCLI(t, "bench", "-database-url", dbtest.URL(), "-mode", "relay", "-broker", "pulsar")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, `-broker "pulsar": use memory, rabbitmq or kafka`)
}
