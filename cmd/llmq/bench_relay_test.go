package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/outbox"
)

// TestMain lets the test binary stand in for the llmq binary as a relay
// process of `llmq bench -mode relay`, which re-executes itself: without
// this, the child would run the tests.
func TestMain(m *testing.M) {
	// The relay and reuse modes' child processes are this test binary
	// re-executed with their variable set.
	if os.Getenv(benchRelayChild) != "" || os.Getenv(benchReuseChild) != "" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	// Every goroutine the tests start (servers, runners, relays, streams)
	// must end with them.
	goleak.VerifyTestMain(m)
}

// One relay process of the bench, run in-process: it stands by while the
// lease is held, says ready once it holds no connection, publishes the
// backlog when the lease is freed, and reports what its broker confirmed
// when told to stop. (The whole mode re-executes the llmq binary, which a
// test binary is not.)
func TestBenchRelayWorker(t *testing.T) {
	t.Parallel()
	c := setup(t)
	_, pool := c.migrated()
	events, err := outbox.NewStore(outbox.Config{Schema: c.schema})
	require.NoError(t, err)
	for i := range 50 {
		_, err := events.Write(t.Context(), pool, outbox.Event{Topic: "bench", Key: strconv.Itoa(i % 7), Type: "bench.event", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	_, err = pool.Exec(t.Context(), "UPDATE "+c.schema+".outbox_relay_lease SET holder = $1, lease_epoch = lease_epoch + 1, lease_until = now() + interval '1 hour'", benchGateHolder)
	require.NoError(t, err)

	stopR, stopW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := benchRelayWorker(t.Context(), &common{databaseURL: dbtest.URL()}, benchOptions{batch: 10}, c.schema, 3, stopR, outW, io.Discard)
		_ = outW.CloseWithError(fmt.Errorf("worker returned: %w", err))
		done <- err
	}()
	out := bufio.NewReader(outR)
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	// The worker is ready once its pool has closed the connection of its
	// first lease check; the server's backend of that connection may still
	// be ending. The next check comes seconds later (StandbyPoll), so a
	// connection still there after a second would be one the standby holds.
	require.Eventually(t, func() bool {
		var conns int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", relayAppName(c.schema, 3)).Scan(&conns))
		return conns == 0
	}, time.Second, 5*time.Millisecond, "a standby relay holds no connection")

	_, err = pool.Exec(t.Context(), "UPDATE "+c.schema+".outbox_relay_lease SET lease_until = '-infinity'")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var pending int
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+c.schema+".outbox WHERE published_at IS NULL").Scan(&pending))
		return pending == 0
	}, 30*time.Second, 10*time.Millisecond)
	var holder string
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT holder FROM "+c.schema+".outbox_relay_lease").Scan(&holder))
	require.Equal(t, relayID(3), holder)

	require.NoError(t, stopW.Close())
	var share relayShare
	require.NoError(t, json.NewDecoder(out).Decode(&share))
	require.Equal(t, 50, share.Confirmed)
	require.NoError(t, <-done)
}

// A relay process that fails says why: how it exited and what it wrote,
// not just that its output ended.
func TestBenchRelayProcessFailureSaysWhy(t *testing.T) {
	t.Parallel()
	var progress syncWriter
	p := &relayProcess{index: 5}
	// /bin/sh runs "bench" as a script, which does not exist.
	err := p.start(t.Context(), "/bin/sh", dbtest.URL(), "llmq_nowhere", 10, false, &progress)
	require.Error(t, err)
	require.Contains(t, err.Error(), "relay process 5 was not ready")
	require.Contains(t, err.Error(), "exit status 2")
	require.Contains(t, err.Error(), "bench", "its stderr is quoted")
	require.Contains(t, progress.String(), "relay 5: ", "and passed on, prefixed")
}

// syncWriter is a buffer safe for concurrent writers.
type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// The relay mode runs its relays as processes, one active, and reports
// their peak connections within the outbox package's budgets.
func TestBenchRelayFleet(t *testing.T) {
	t.Parallel()
	for _, deletePublished := range []bool{false, true} {
		t.Run("delete-published="+strconv.FormatBool(deletePublished), func(t *testing.T) {
			t.Parallel()
			code, out, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-mode", "relay", "-jobs", "300", "-workers", "3",
				"-delete-published="+strconv.FormatBool(deletePublished), "-keep")
			require.Equal(t, 0, code, stderr)
			schema := regexp.MustCompile(`schema=(\S+)`).FindStringSubmatch(stderr)
			require.NotNil(t, schema, stderr)
			pool := dbtest.Pool(t, 2)
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema[1]+" CASCADE") })
			m := regexp.MustCompile(`llmq relay fleet: relays=3 as=processes active=bench-relay-\d events=300 seconds=[0-9.]+ events_per_s=\d+ takeover_after_free_s=[0-9.]+ ` +
				`peak_connections: active_relay=(\d+) \(budget 4\) standby_relay=(\d+) \(budget 1\) all_relays=\d+`).FindStringSubmatch(out)
			require.NotNil(t, m, out)
			active, _ := strconv.Atoi(m[1])
			standby, _ := strconv.Atoi(m[2])
			require.LessOrEqual(t, active, relayBudgetActive)
			require.LessOrEqual(t, standby, relayBudgetStandby)
			require.Contains(t, stderr, `msg="llmq: outbox relay active"`, "the hand-over is logged")
			var kept int
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+schema[1]+".outbox").Scan(&kept))
			if deletePublished {
				require.Contains(t, out, "timed=from the takeover to the first look (every 20ms) finding no event waiting, all 3 relays started and standing by")
				require.Zero(t, kept, "the relays deleted what they published")
			} else {
				require.Contains(t, out, "timed=from the takeover to the last event published, all 3 relays started and standing by")
				require.Equal(t, 300, kept, "the relays kept what they published")
			}
			if _, err := os.Stat("/proc/self/stat"); err == nil {
				require.Regexp(t, `cpu_s: active_relay=[0-9.]+ standby_relays=[0-9.]+ \([0-9.]+% of a core over [0-9.]+s\)`, out)
			}
		})
	}
}

// A process's CPU time is read from its /proc stat line, whose command
// name may hold spaces and parentheses.
func TestProcCPU(t *testing.T) {
	t.Parallel()
	line := "4242 (llmq (bench) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 8 0 100 0 0"
	require.Equal(t, 1750*time.Millisecond, procCPU(line))
	require.Negative(t, procCPU("4242 (llmq) S 1"), "too few fields")
	require.Negative(t, procCPU("no parenthesis"))
	require.Negative(t, procCPU("1 (x) S 1 1 1 0 -1 0 0 0 0 0 -150 25 0"), "negative ticks")
	own, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Logf("no /proc here (%v): only the parser is checked", err)
		return
	}
	require.Positive(t, procCPU(string(own)), "this test process has used some CPU")
}

func FuzzProcCPU(f *testing.F) {
	f.Add("4242 (llmq) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 8 0 100 0 0")
	f.Add("1 ()) R")
	f.Add("1 (x) S 1 1 1 0 -1 0 0 0 0 0 68719476735 68719476735 0 0") // the largest accepted ticks
	f.Add("1 (x) S 1 1 1 0 -1 0 0 0 0 0 1099511627775 1099511627775 0 0")
	f.Fuzz(func(t *testing.T, stat string) {
		// Never a negative time but -1, and no overflow.
		require.GreaterOrEqual(t, procCPU(stat), time.Duration(-1))
	})
}
