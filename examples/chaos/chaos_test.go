package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/llmqtest"
)

// The test binary re-executes itself as the run's child processes.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		err := runChild(ctx, os.Stdin, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every goroutine the tests start (servers, runners, relays, streams)
	// must end with them.
	goleak.VerifyTestMain(m)
}

// setup returns the reduced configuration CI runs: two worker processes,
// 15s of arrivals, every fault kind once.
func setup(t *testing.T, broker string) Config {
	t.Helper()
	return Config{
		Duration: 15 * time.Second, Rate: 3, Workers: 2, PerWorker: 3, Broker: broker,
		DuplicateRate: 0.25, FaultEvery: time.Hour, Drain: 40 * time.Second,
		DatabaseURL: llmqtest.URL(), AMQPURL: os.Getenv("AMQP_URL"), Out: t.Output(),
		Command: func(string) *exec.Cmd {
			return exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$") //nolint:gosec // the test binary, re-executed
		},
	}
}

// Under every fault kind — worker processes killed after the provider
// answered, a worker paused past its lease, the signal path's consumer
// stopped between commit and ack, the
// broker severed, Postgres backends terminated mid-transaction, a 429
// storm, hung calls, malformed JSON, the ERP down — every accepted job is
// in the database in an explainable state with its attempts, no result is
// replaced, each success reaches the ERP exactly once and nothing else
// does, provider calls stay within attempts and the provider's limits, the
// usage ledger matches the provider's own count, and every job event is
// handled once.
func TestChaos(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{brokerKafka, brokerRabbitMQ} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			report, err := Run(t.Context(), setup(t, broker))
			require.NoError(t, err)
			report.Print(t.Output())
			require.Empty(t, report.Violations)
			// A defect is a DESIGN guarantee broken outside llmq's
			// packages, by examples/invoice's handler (Report.Defects).
			require.Empty(t, report.Defects)
			require.True(t, report.Settled, "every job finished and every job event was handled")
			for _, kind := range allFaults {
				require.Positive(t, report.Faults[kind], "fault %s was injected", kind)
			}
			require.Equal(t, report.Accepted, report.InDB)
			require.Positive(t, report.Accepted)
			require.Positive(t, report.SameKeyResubmissions)
			require.Positive(t, report.InboxDuplicates, "the held event came again as a duplicate")
			require.Positive(t, report.Stale, "the paused worker's completion was recorded as stale")
			require.Positive(t, report.LedgerTokens, "the usage ledger holds the answers' usage")
		})
	}
}

// The window check counts calls by start time in every window of the
// given length, so a burst straddling two fixed minutes is not split.
func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	call := func(offset time.Duration, tokens int64) fakeprovider.Call {
		return fakeprovider.Call{Start: at.Add(offset), PromptTokens: tokens}
	}
	calls := []fakeprovider.Call{
		call(50*time.Second, 10), call(0, 1), call(55*time.Second, 10), call(70*time.Second, 10), call(109*time.Second, 10), call(111*time.Second, 100),
	}
	n, tokens := maxInWindow(calls, time.Minute)
	require.Equal(t, 4, n, "50s, 55s, 70s and 109s lie within one minute")
	require.Equal(t, int64(130), tokens, "55s, 70s, 109s and 111s: 130 tokens")
	n, tokens = maxInWindow(nil, time.Minute)
	require.Zero(t, n)
	require.Zero(t, tokens)
}
