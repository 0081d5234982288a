package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// stepProvider is a fake provider that counts the calls of each step and
// answers each with its step's name.
type stepProvider struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func newStepProvider(t *testing.T) *stepProvider {
	t.Helper()
	p := &stepProvider{calls: map[string]int{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		step := r.URL.Query().Get("step")
		p.mu.Lock()
		p.calls[step]++
		p.mu.Unlock()
		_, _ = fmt.Fprintf(w, `{"step":%q}`, step)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *stepProvider) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.calls))
	for k, v := range p.calls {
		out[k] = v
	}
	return out
}

// stepOutput is what each step of the three-step handler returns.
type stepOutput struct {
	Step string `json:"step"`
}

// callStep is one paid call of a step: a POST to the provider, with usage
// recorded as a provider SDK's answer would report it.
func callStep(ctx context.Context, url, step string) (stepOutput, error) {
	body, err := callProvider(ctx, url+"?step="+step)
	if err != nil {
		return stepOutput{}, err
	}
	lease.RecordUsage(ctx, jobs.Usage{InputTokens: 100, OutputTokens: 10})
	var out stepOutput
	err = json.Unmarshal(body, &out)
	return out, err
}

// threeSteps is an OCR → extract → validate handler, each step one paid
// call; after reports each step's end (and may block, or fail the step).
func threeSteps(url string, after func(ctx context.Context, job *jobs.Job, step string) error) lease.Handler {
	return lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		var outs []string
		for _, name := range []string{"ocr", "extract", "validate"} {
			out, err := lease.Step(ctx, name, func(ctx context.Context) (stepOutput, error) {
				out, err := callStep(ctx, url, name)
				if err != nil {
					return out, err
				}
				return out, after(ctx, job, name)
			})
			if err != nil {
				return nil, err
			}
			outs = append(outs, out.Step)
		}
		return json.Marshal(outs)
	})
}

// A retry runs only the steps that had not succeeded: the first attempt's
// third step fails, the second attempt reuses the first two and pays only
// for the third. The history says which attempt ran each step, which
// reused it, and each attempt's usage counts only what it paid for.
func TestRetryRunsOnlyUnfinishedSteps(t *testing.T) {
	t.Parallel()
	f := setup(t)
	provider := newStepProvider(t)
	var failed atomic.Bool
	handler := threeSteps(provider.URL, func(_ context.Context, _ *jobs.Job, step string) error {
		if step == "validate" && failed.CompareAndSwap(false, true) {
			return errors.New("validation service answered 503")
		}
		return nil
	})
	job := f.enqueue(jobs.EnqueueParams{Kind: "invoice", MaxAttempts: 3})
	f.start(fastConfig(map[string]lease.Handler{"invoice": handler}))

	done := f.await(job.ID)
	require.Equal(t, jobs.StateSucceeded, done.State, done.LastError)
	require.JSONEq(t, `["ocr","extract","validate"]`, string(done.Result))
	require.Equal(t, map[string]int{"ocr": 1, "extract": 1, "validate": 2}, provider.counts(),
		"the retry paid only for the step that had failed")

	steps, err := f.store.Steps(t.Context(), f.pool, "acme", job.ID)
	require.NoError(t, err)
	require.Len(t, steps, 3)
	byName := map[string]jobs.Step{}
	for _, s := range steps {
		byName[s.Name] = s
	}
	require.Equal(t, 1, byName["ocr"].Attempt)
	require.Equal(t, []int{2}, byName["ocr"].ReusedBy)
	require.Equal(t, []int{2}, byName["extract"].ReusedBy)
	require.Equal(t, 2, byName["validate"].Attempt)
	require.Empty(t, byName["validate"].ReusedBy)
	require.Equal(t, jobs.Usage{InputTokens: 100, OutputTokens: 10}, byName["ocr"].Usage, "a step keeps what it paid")

	attempts := f.attempts(job.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, int64(300), attempts[0].Usage.InputTokens, "attempt 1 paid for three calls")
	require.Equal(t, int64(100), attempts[1].Usage.InputTokens, "attempt 2 for one: reused steps cost nothing")
}

// A stale attempt's step is neither stored nor reused: once the job's
// fence has moved on (its lease was taken back), Step returns an error
// wrapping jobs.ErrLeaseLost without calling fn, and nothing is stored.
func TestStaleAttemptStoresNoStep(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started := make(chan *jobs.Job, 1)
	proceed := make(chan struct{})
	stepErr := make(chan error, 1)
	calls := 0
	handler := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		started <- job
		<-proceed
		_, err := lease.Step(ctx, "extract", func(context.Context) (int, error) {
			calls++
			return 42, nil
		})
		stepErr <- err
		return nil, err
	})
	job := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	_, stop := f.start(fastConfig(map[string]lease.Handler{"k": handler}))
	running := <-started
	// Another runner took the job over: the fence moved on.
	_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".jobs SET fence = fence + 1 WHERE id = $1", job.ID)
	require.NoError(t, err)
	close(proceed)
	require.ErrorIs(t, <-stepErr, jobs.ErrLeaseLost)
	require.Zero(t, calls, "a stale attempt does not run the step")
	require.NoError(t, stop())

	var stored int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".job_steps").Scan(&stored))
	require.Zero(t, stored)
	require.Equal(t, job.ID, running.ID)
}

// A step can hold a permit of its own pool (StepConfig.Admission): fn runs
// with the permit (PermitOf), and a reused step takes none. A step asking
// for a permit from a runner without Config.Admission fails its job at
// once, since no retry could change that.
func TestStepUnderItsOwnPermit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	limiter, err := admission.NewLocal(admission.Pool{Name: "vision", RPM: 6000, TPM: 1_000_000, MaxInFlight: 4})
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		permits []*admission.Permit
		failed  atomic.Bool
	)
	handler := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		out, err := lease.StepWith(ctx, "ocr", lease.StepConfig{Admission: &admission.Request{Pool: "vision", Tenant: job.Tenant, Tokens: 500}},
			func(ctx context.Context) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				permits = append(permits, lease.PermitOf(ctx))
				return "text", nil
			})
		if err != nil {
			return nil, err
		}
		if failed.CompareAndSwap(false, true) {
			return nil, errors.New("the next step failed")
		}
		return json.Marshal(out)
	})
	cfg := fastConfig(map[string]lease.Handler{"k": handler})
	cfg.Admission = &lease.Admission{Limiter: limiter, Route: func(*jobs.Job) (admission.Request, bool) { return admission.Request{}, false }}
	job := f.enqueue(jobs.EnqueueParams{Kind: "k", MaxAttempts: 3})
	f.start(cfg)
	done := f.await(job.ID)
	require.Equal(t, jobs.StateSucceeded, done.State, done.LastError)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, permits, 1, "the second attempt reused the step and took no permit")
	require.NotNil(t, permits[0])
	require.Equal(t, "vision", permits[0].Pool)

	g := setup(t)
	noAdmission := lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		_, err := lease.StepWith(ctx, "ocr", lease.StepConfig{Admission: &admission.Request{Pool: "vision", Tokens: 1}},
			func(context.Context) (int, error) { return 1, nil })
		return nil, err
	})
	misconfigured := g.enqueue(jobs.EnqueueParams{Kind: "k", MaxAttempts: 3})
	g.start(fastConfig(map[string]lease.Handler{"k": noAdmission}))
	dead := g.await(misconfigured.ID)
	require.Equal(t, jobs.StateFailedTerminal, dead.State)
	require.Contains(t, dead.LastError, "no Config.Admission")
	require.Len(t, g.attempts(misconfigured.ID), 1, "not retried")
}

// Outside an attempt (a handler called directly, as in a unit test) Step
// just calls fn.
func TestStepOutsideAnAttempt(t *testing.T) {
	t.Parallel()
	calls := 0
	for range 2 {
		out, err := lease.Step(t.Context(), "extract", func(context.Context) (string, error) {
			calls++
			return "ok", nil
		})
		require.NoError(t, err)
		require.Equal(t, "ok", out)
	}
	require.Equal(t, 2, calls)
}

// runStepWorker is a child process's runner with the three-step handler;
// after its second step has been stored it says so on stdout and waits to
// be killed.
func runStepWorker() int {
	provider := os.Getenv("LLMQ_TEST_PROVIDER")
	return runChildRunner(func(*pgxpool.Pool, string) lease.Config {
		handler := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
			for _, name := range []string{"ocr", "extract"} {
				if _, err := lease.Step(ctx, name, func(ctx context.Context) (stepOutput, error) {
					return callStep(ctx, provider, name)
				}); err != nil {
					return nil, err
				}
			}
			fmt.Println("stored two steps")
			<-make(chan struct{}) // killed here, before the third step
			return nil, nil
		})
		return lease.Config{
			Handlers:      map[string]lease.Handler{"invoice": handler},
			WorkerID:      "killed-between-steps",
			LeaseDuration: 6 * time.Second, // see runDoomedWorker
			ReapInterval:  time.Hour,
		}
	})
}

// A worker process SIGKILLed after its second step: the job's next attempt,
// in another runner, takes the two stored steps and runs only the third.
// The provider counts three calls for three steps.
func TestKilledWorkerRetryRunsOnlyTheLastStep(t *testing.T) {
	t.Parallel()
	f := setup(t)
	provider := newStepProvider(t)
	job := f.enqueue(jobs.EnqueueParams{Kind: "invoice"})

	killChildAfter(t, "step-worker", f.schema, provider.URL, "stored two steps")

	f.start(fastConfig(map[string]lease.Handler{"invoice": threeSteps(provider.URL, func(context.Context, *jobs.Job, string) error { return nil })}))
	done := f.await(job.ID)
	require.Equal(t, jobs.StateSucceeded, done.State, done.LastError)
	require.JSONEq(t, `["ocr","extract","validate"]`, string(done.Result))
	require.Equal(t, map[string]int{"ocr": 1, "extract": 1, "validate": 1}, provider.counts(),
		"three steps, three paid calls")

	attempts := f.attempts(job.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.AttemptLeaseExpired, attempts[0].Outcome)
	steps, err := f.store.Steps(t.Context(), f.pool, "acme", job.ID)
	require.NoError(t, err)
	require.Len(t, steps, 3)
	for _, s := range steps {
		if s.Name == "validate" {
			require.Equal(t, 2, s.Attempt)
			continue
		}
		require.Equal(t, 1, s.Attempt, s.Name)
		require.Equal(t, []int{2}, s.ReusedBy, s.Name)
	}
}
