package providerbatch_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	llmqopenai "github.com/llmq/llmq/provider/openai"
	"github.com/llmq/llmq/providerbatch"
)

// The test binary re-executes itself as a submitter process that a test
// kills with SIGKILL at a chosen point.
const (
	childEnv       = "LLMQ_PROVIDERBATCH_CHILD"
	childSchemaEnv = "LLMQ_PROVIDERBATCH_SCHEMA"
	childURLEnv    = "LLMQ_PROVIDERBATCH_FAKE"
	childAPIEnv    = "LLMQ_PROVIDERBATCH_API" // "anthropic": Message Batches; else OpenAI's
	// stallAfter is how many results the "applying" child applies before
	// it stalls: one chunk of 500 committed, the next one read but not.
	stallAfter = 600
)

// runChildSubmitter runs a submitter on the test's schema and fake
// provider until it is killed.
func runChildSubmitter(point string) int {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	schema := os.Getenv(childSchemaEnv)
	store, err := jobs.NewStore(jobs.Config{Schema: schema, Queues: []string{jobs.DefaultQueue, batchQueue}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	provider, call, poolName, err := childProvider()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if point == "applying" {
		provider = &stallResults{Provider: provider, after: stallAfter}
	}
	s, err := providerbatch.NewSubmitter(db, store, providerbatch.Config{
		Pool: poolName, Queue: batchQueue, Provider: provider, Calls: []providerbatch.KindCall{call},
		Schema: schema, ID: "doomed", LeaseDuration: 2 * time.Second,
		GatherInterval: 10 * time.Millisecond, PollMin: 10 * time.Millisecond, PollMax: 20 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childProvider is the child's batch API on the test's fake, its kind's
// call and its pool: OpenAI's, or Anthropic's when childAPIEnv says so.
func childProvider() (providerbatch.Provider, providerbatch.KindCall, string, error) {
	url := os.Getenv(childURLEnv)
	if os.Getenv(childAPIEnv) == "anthropic" {
		opts, err := llmqanthropic.Options(llmqanthropic.Config{})
		if err != nil {
			return nil, providerbatch.KindCall{}, "", err
		}
		client := sdk.NewClient(append([]anthropicoption.RequestOption{anthropicoption.WithBaseURL(url), anthropicoption.WithAPIKey("key")}, opts...)...)
		return llmqanthropic.NewBatches(client, llmqanthropic.BatchesConfig{}), claudeCall.Batch(), "anthropic", nil
	}
	client := oai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("key"), option.WithMaxRetries(0))
	batches, err := llmqopenai.NewBatches(client, llmqopenai.BatchesConfig{})
	return batches, extractCall.Batch(), pool, err
}

// stallResults passes after results and then waits, as a submitter killed
// half-way through a batch's results would have.
type stallResults struct {
	providerbatch.Provider
	after int
}

func (s *stallResults) Results(ctx context.Context, id string, fn func(providerbatch.Result) error) error {
	n := 0
	return s.Provider.Results(ctx, id, func(r providerbatch.Result) error {
		if n == s.after {
			<-ctx.Done()
			return ctx.Err()
		}
		n++
		return fn(r)
	})
}

// killTest is a submitter process, the fake provider it talks to and
// what the fake saw.
type killTest struct {
	*harness
	child    atomic.Pointer[os.Process]
	mu       sync.Mutex
	answered map[string]int          // batch requests answered, by custom id
	stderr   telemetrytest.LogBuffer // exec copies into it from its own goroutine while a failing test reads it
	api      string                  // childAPIEnv's value: "" (OpenAI) or "anthropic"
}

func newKillTest(t *testing.T, onCreate func(k *killTest)) *killTest {
	t.Helper()
	k := &killTest{answered: map[string]int{}}
	k.harness = newHarness(t, fakeprovider.Config{
		OnBatchCreate: func(fakeprovider.BatchCreated) {
			if onCreate != nil {
				onCreate(k)
			}
		},
		OnBatchRequest: func(r fakeprovider.BatchRequest) {
			k.mu.Lock()
			k.answered[r.CustomID]++
			k.mu.Unlock()
		},
	})
	return k
}

// start runs the child submitter.
func (k *killTest) start(point string) {
	k.t.Helper()
	cmd := exec.CommandContext(k.t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+point, childSchemaEnv+"="+k.db.Schema, childURLEnv+"="+k.url, childAPIEnv+"="+k.api)
	cmd.Stderr = &k.stderr
	require.NoError(k.t, cmd.Start())
	k.child.Store(cmd.Process)
	k.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if k.t.Failed() {
			k.t.Logf("child stderr:\n%s", k.stderr.String())
		}
	})
}

// kill SIGKILLs the child.
func (k *killTest) kill() {
	if p := k.child.Load(); p != nil {
		_ = p.Signal(syscall.SIGKILL)
	}
}

// await waits for cond, checked every 10ms, for up to a minute.
func (k *killTest) await(what string, cond func() bool) {
	k.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			k.t.Fatalf("a minute passed and still not %s; child stderr:\n%s", what, k.stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition another process makes true
	}
}

// takeOver runs a successor until every job succeeded, then checks that
// no request was sent twice, no job lost, none completed twice.
func (k *killTest) takeOver(ids []uuid.UUID) {
	k.t.Helper()
	cfg := k.cfg
	if k.api == "anthropic" {
		cfg = k.anthropicConfig()
	}
	cfg.ID = "successor"
	s := k.submitter(cfg)
	k.await("every job succeeded under the successor", func() bool {
		require.NoError(k.t, s.Pass(k.t.Context()))
		return k.states()[jobs.StateSucceeded] == len(ids)
	})
	require.Equal(k.t, int64(1), k.fake.Stats().BatchesCreated, "the successor did not send the submission again")
	k.mu.Lock()
	for id, n := range k.answered {
		require.Equal(k.t, 1, n, "request %s answered %d times", id, n)
	}
	require.Len(k.t, k.answered, len(ids))
	k.mu.Unlock()
	var succeeded, jobsWithOne int
	require.NoError(k.t, k.db.Pool.QueryRow(k.t.Context(), `SELECT count(*), count(DISTINCT job_id) FROM `+k.db.Schema+`.job_attempts WHERE outcome = 'succeeded'`).
		Scan(&succeeded, &jobsWithOne))
	require.Equal(k.t, len(ids), succeeded, "one succeeded attempt a job")
	require.Equal(k.t, len(ids), jobsWithOne)
	sub := k.submissions()[0]
	require.Equal(k.t, "ended", sub.State)
	require.Equal(k.t, len(ids), sub.Succeeded, "each item counted once")
}

func (k *killTest) texts(n int) []uuid.UUID {
	texts := make([]string, n)
	for i := range texts {
		texts[i] = invoice(i, "")
	}
	if k.api == "anthropic" {
		return k.enqueueClaude(texts...)
	}
	return k.enqueue(texts...)
}

// Killed after the provider created the batch and before the submitter
// recorded its id: the successor finds it by the submission id in its
// metadata and adopts it.
func TestSubmitterKilledAfterCreate(t *testing.T) {
	t.Parallel()
	k := newKillTest(t, func(k *killTest) { k.kill() })
	k.fake.HoldBatches()
	ids := k.texts(20)
	k.start("after-create")
	k.await("the batch created", func() bool { return k.fake.Stats().BatchesCreated == 1 })
	state := k.submissions()[0].State
	t.Logf("the child died with the submission %s", state)
	k.fake.ReleaseBatches()
	k.takeOver(ids)
}

// The same over Anthropic's Message Batches, which keep no tag: the
// successor finds the batch by its size and creation time and adopts it.
func TestSubmitterKilledAfterCreatingAMessageBatch(t *testing.T) {
	t.Parallel()
	k := newKillTest(t, func(k *killTest) { k.kill() })
	k.api = "anthropic"
	k.fake.HoldBatches()
	ids := k.texts(20)
	k.start("after-create")
	k.await("the batch created", func() bool { return k.fake.Stats().BatchesCreated == 1 })
	k.fake.ReleaseBatches()
	k.takeOver(ids)
}

// Killed while polling: the successor polls on.
func TestSubmitterKilledWhilePolling(t *testing.T) {
	t.Parallel()
	k := newKillTest(t, nil)
	k.fake.HoldBatches()
	ids := k.texts(20)
	k.start("polling")
	k.await("three polls", func() bool { subs := k.submissions(); return len(subs) == 1 && subs[0].Polls >= 3 })
	k.kill()
	k.fake.ReleaseBatches()
	k.takeOver(ids)
}

// Killed half-way through applying results: one chunk committed, the
// rest read again by the successor, which applies only what was not.
func TestSubmitterKilledWhileApplying(t *testing.T) {
	t.Parallel()
	k := newKillTest(t, nil)
	ids := k.texts(1_200)
	k.start("applying")
	k.await("the first chunk applied", func() bool { subs := k.submissions(); return len(subs) == 1 && subs[0].Succeeded >= 500 })
	k.kill()
	require.Equal(t, 500, k.submissions()[0].Succeeded, "the child stalled after one chunk")
	k.takeOver(ids)
}
