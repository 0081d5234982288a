package lease_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// The test binary re-executes itself as a worker process for tests that
// must kill a real process.
const childEnv = "LLMQ_LEASE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "worker-killed-after-provider":
		os.Exit(runDoomedWorker())
	case "capped-worker":
		os.Exit(runCappedWorker())
	case "step-worker":
		os.Exit(runStepWorker())
	}
	// Every runner a test starts must be gone when the tests end: no
	// attempt, completer, heartbeat or listener goroutine outlives Run.
	goleak.VerifyTestMain(m)
}

// callProvider makes the "model call": one POST to the fake provider.
func callProvider(ctx context.Context, url string) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, http.NoBody)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return body, err
}

// runChildRunner is the body of a child process: it connects to the
// test's database and schema, builds the runner's configuration with
// config, and runs it until the process is killed. It returns the exit
// code.
func runChildRunner(config func(pool *pgxpool.Pool, schema string) lease.Config) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	schema := os.Getenv("LLMQ_TEST_SCHEMA")
	store, err := jobs.NewStore(jobs.Config{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r, err := lease.NewRunner(pool, store, config(pool, schema))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// killChildAfter starts this test binary as a child worker process of the
// given mode on schema, waits until it prints line on stdout, and kills it
// (SIGKILL).
func killChildAfter(t *testing.T, mode, schema, providerURL, line string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"="+mode,
		"LLMQ_TEST_SCHEMA="+schema,
		"LLMQ_TEST_PROVIDER="+providerURL,
		"DATABASE_URL="+dbtest.URL())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	said := make(chan string, 1)
	go func() {
		got, _ := bufio.NewReader(stdout).ReadString('\n')
		said <- got
	}()
	select {
	case got := <-said:
		require.Equal(t, line+"\n", got)
	case <-time.After(30 * time.Second):
		t.Fatalf("the child worker (%s) did not say %q within 30s", mode, line)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
}

// runDoomedWorker runs a runner whose handler calls the provider, reports
// "responded" on stdout and then waits to be killed before it can complete.
func runDoomedWorker() int {
	provider := os.Getenv("LLMQ_TEST_PROVIDER")
	return runChildRunner(func(*pgxpool.Pool, string) lease.Config {
		return lease.Config{
			Handlers: map[string]lease.Handler{"extract": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
				if _, err := callProvider(ctx, provider); err != nil {
					return nil, err
				}
				fmt.Println("responded")
				<-make(chan struct{}) // killed here: the answer never gets recorded
				return nil, nil
			})},
			WorkerID: "doomed",
			// Long enough that the claim's own timeout (a third of it)
			// outlasts a slow commit on a loaded machine: a claim that
			// commits after its caller gave up leaves the job leased,
			// unrun, until the lease expires, and this process does not
			// reap.
			LeaseDuration: 6 * time.Second,
			ReapInterval:  time.Hour,
		}
	})
}

// A worker process killed (SIGKILL) just after the provider answered, before
// it recorded anything: the reaper takes the job back once the lease runs
// out, another runner completes it, and the history shows both attempts.
func TestWorkerKilledAfterProviderResponded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var calls atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		_, _ = io.WriteString(w, `{"total":"42.00"}`)
	}))
	t.Cleanup(provider.Close)

	job := f.enqueue(jobs.EnqueueParams{Kind: "extract"})

	killChildAfter(t, "worker-killed-after-provider", f.schema, provider.URL, "responded")

	running, err := f.store.Get(t.Context(), f.pool, "acme", job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateRunning, running.State, "the dead worker's lease is still held")

	cfg := fastConfig(map[string]lease.Handler{"extract": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		return callProvider(ctx, provider.URL)
	})})
	f.start(cfg)
	done := f.await(job.ID)
	require.Equal(t, jobs.StateSucceeded, done.State)
	require.JSONEq(t, `{"total":"42.00"}`, string(done.Result))

	attempts := f.attempts(job.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, "doomed", attempts[0].Worker)
	require.Equal(t, jobs.AttemptLeaseExpired, attempts[0].Outcome)
	require.True(t, attempts[0].Usage.Uncertain, "the killed attempt's call may have been billed")
	require.Equal(t, jobs.AttemptSucceeded, attempts[1].Outcome)
	require.Equal(t, int32(2), calls.Load(), "one provider call per attempt, never more")

	var completed int
	require.NoError(t, f.pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+dbtest.OutboxEvents(f.schema, "o")+" WHERE event_type = 'extract.completed'").Scan(&completed))
	require.Equal(t, 1, completed, "the job succeeded once")
}
