package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// claimCounter numbers claims in the order they start, and remembers, for
// each job, which claim took it.
type claimCounter struct {
	jobs.RunnerStore
	mu      sync.Mutex
	claims  int
	claimNo map[uuid.UUID]int
}

func (c *claimCounter) Claim(ctx context.Context, db jobs.DBTX, p jobs.ClaimParams) ([]*jobs.Job, error) {
	c.mu.Lock()
	c.claims++
	n := c.claims
	c.mu.Unlock()
	claimed, err := c.RunnerStore.Claim(ctx, db, p)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, j := range claimed {
		c.claimNo[j.ID] = n
	}
	return claimed, err
}

// count is how many claims have started.
func (c *claimCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claims
}

func (c *claimCounter) claimOf(id uuid.UUID) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.claimNo[id]
	return n, ok
}

func (f *fixture) enqueueMany(tenant string, n int, p jobs.EnqueueParams) []*jobs.Job {
	f.t.Helper()
	params := make([]jobs.EnqueueParams, n)
	for i := range params {
		params[i] = p
		params[i].Tenant = tenant
	}
	res, err := f.store.EnqueueMany(f.t.Context(), f.pool, params)
	require.NoError(f.t, err)
	out := make([]*jobs.Job, n)
	for i, r := range res {
		out[i] = r.Job
	}
	return out
}

// One tenant's 10,000 queued jobs do not hold back another tenant's single
// job: it is taken by one of the first two claims that start after its
// enqueue returned (a claim already running may not see it).
func TestSmallTenantIsServedPromptly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	counter := &claimCounter{RunnerStore: f.store, claimNo: map[uuid.UUID]int{}}
	cfg := fastConfig(map[string]lease.Handler{"extract": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
		return json.RawMessage(`{}`), nil
	})})
	f.enqueueMany("big", 10_000, jobs.EnqueueParams{Kind: "extract"})
	f.startWith(counter, cfg)
	require.Eventually(t, func() bool { return counter.count() >= 5 }, 10*time.Second, 5*time.Millisecond)

	small := f.enqueueMany("small", 1, jobs.EnqueueParams{Kind: "extract"})[0]
	// Claims that started before this point may not see the job; those
	// after it all can.
	before := counter.count()
	var claimNo int
	require.Eventually(t, func() bool {
		n, ok := counter.claimOf(small.ID)
		claimNo = n
		return ok
	}, 10*time.Second, 5*time.Millisecond)
	require.LessOrEqual(t, claimNo-before, 2, "the small tenant's job waited for more than two claims")
}

// Three always-backlogged tenants with weights 1:2:4 receive completions in
// that proportion. The weights are set while the runner runs: limits are
// data, read by each claim.
func TestWeightedFairSharing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var mu sync.Mutex
	done := map[string]int{}
	total := 0
	const window = 1400
	cfg := fastConfig(map[string]lease.Handler{"extract": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})})
	cfg.AfterRecord = func(job *jobs.Job, err error) {
		if err != nil || job.State != jobs.StateSucceeded {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if total < window {
			done[job.Tenant]++
			total++
		}
	}
	f.start(cfg)
	weights := map[string]int{"one": 1, "two": 2, "four": 4}
	for tenant, w := range weights {
		require.NoError(t, f.store.SetTenantLimits(t.Context(), f.pool, tenant, jobs.TenantLimits{Weight: w}))
	}
	// One statement, so that no tenant's backlog is there before the others.
	var params []jobs.EnqueueParams
	for range 3000 {
		for tenant := range weights {
			params = append(params, jobs.EnqueueParams{Tenant: tenant, Kind: "extract"})
		}
	}
	_, err := f.store.EnqueueMany(t.Context(), f.pool, params)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total >= window
	}, 60*time.Second, 10*time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	t.Logf("completions in the window: %v", done)
	var sum, sumSq float64
	for tenant, w := range weights {
		expected := float64(window) * float64(w) / 7
		require.InDelta(t, expected, float64(done[tenant]), 0.10*expected, "tenant %s (weight %d)", tenant, w)
		x := float64(done[tenant]) / float64(w)
		sum += x
		sumSq += x * x
	}
	jain := sum * sum / (float64(len(weights)) * sumSq)
	t.Logf("Jain's index of weight-normalised throughput: %.4f", jain)
	require.GreaterOrEqual(t, jain, 0.95)
}

// With both classes backlogged, the low class still receives its minimum
// share; otherwise urgent jobs overtake it.
func TestPriorityWithoutStarvation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var mu sync.Mutex
	var order []int
	cfg := fastConfig(map[string]lease.Handler{"extract": lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, job.Priority)
		return json.RawMessage(`{}`), nil
	})})
	cfg.Queues = map[string]lease.QueueConfig{lease.DefaultQueue: {MaxWorkers: 10, LowPriorityShare: 0.2}}
	f.enqueueMany("acme", 1000, jobs.EnqueueParams{Kind: "extract", Priority: 5})
	f.enqueueMany("acme", 1000, jobs.EnqueueParams{Kind: "extract", Priority: 0})
	f.start(cfg)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= 500
	}, 30*time.Second, 10*time.Millisecond)

	mu.Lock()
	low := 0
	for _, p := range order[:500] {
		if p == 5 {
			low++
		}
	}
	mu.Unlock()
	t.Logf("low-priority share of the first 500 jobs: %.3f", float64(low)/500)
	require.InDelta(t, 0.2, float64(low)/500, 0.06, "the low class gets its share while both are backlogged")

	// Strict priority when the share is off: every urgent job first.
	g := setup(t)
	var strict []int
	cfg = fastConfig(map[string]lease.Handler{"extract": lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		strict = append(strict, job.Priority)
		return json.RawMessage(`{}`), nil
	})})
	cfg.Queues = map[string]lease.QueueConfig{lease.DefaultQueue: {MaxWorkers: 1, LowPriorityShare: -1}}
	g.enqueueMany("acme", 20, jobs.EnqueueParams{Kind: "extract", Priority: 5})
	g.enqueueMany("acme", 20, jobs.EnqueueParams{Kind: "extract", Priority: 0})
	g.start(cfg)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(strict) == 40
	}, 30*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.True(t, slices.IsSorted(strict), "urgent jobs overtake: %v", strict)
}

// 100 jobs of one group run one at a time in acceptance order, while other
// groups of the same tenant run alongside.
func TestGroupKeySerialises(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var mu sync.Mutex
	live := map[string]int{}
	peak := map[string]int{}
	var started []uuid.UUID
	maxTogether := 0
	cfg := fastConfig(map[string]lease.Handler{"deliver": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		mu.Lock()
		live[job.GroupKey]++
		peak[job.GroupKey] = max(peak[job.GroupKey], live[job.GroupKey])
		together := 0
		for _, n := range live {
			together += n
		}
		maxTogether = max(maxTogether, together)
		if job.GroupKey == "invoice-1" {
			started = append(started, job.ID)
		}
		mu.Unlock()
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
		}
		mu.Lock()
		live[job.GroupKey]--
		mu.Unlock()
		return json.RawMessage(`{}`), nil
	})})
	var ordered []uuid.UUID
	for _, j := range f.enqueueMany("acme", 100, jobs.EnqueueParams{Kind: "deliver", GroupKey: "invoice-1"}) {
		ordered = append(ordered, j.ID)
	}
	others := make([]*jobs.Job, 0, 40)
	for g := range 4 {
		others = append(others, f.enqueueMany("acme", 10, jobs.EnqueueParams{Kind: "deliver", GroupKey: fmt.Sprintf("invoice-%d", g+2)})...)
	}
	f.start(cfg)
	for _, id := range append(slices.Clone(ordered), ids(others)...) {
		require.Equal(t, jobs.StateSucceeded, f.await(id).State)
	}
	mu.Lock()
	defer mu.Unlock()
	for group, n := range peak {
		require.Equal(t, 1, n, "group %s ran %d jobs at once", group, n)
	}
	require.Equal(t, ordered, started, "the group's jobs started in acceptance order")
	require.Greater(t, maxTogether, 1, "other groups ran alongside")
}

func ids(js []*jobs.Job) []uuid.UUID {
	out := make([]uuid.UUID, len(js))
	for i, j := range js {
		out[i] = j.ID
	}
	return out
}

// A cap of 5 running jobs for a tenant holds across four runner processes
// of 20 workers each: neither the database nor the handlers ever see more.
func TestTenantCapAcrossProcesses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE %[1]s.live (job_id uuid PRIMARY KEY);
		CREATE TABLE %[1]s.peak (n integer NOT NULL);
		INSERT INTO %[1]s.peak VALUES (0);`, f.schema))
	require.NoError(t, err)
	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "capped", jobs.TenantLimits{Weight: 1, MaxRunning: 5}))
	capped := f.enqueueMany("capped", 150, jobs.EnqueueParams{Kind: "extract"})
	free := f.enqueueMany("free", 150, jobs.EnqueueParams{Kind: "extract"})

	for i := range 4 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(),
			childEnv+"=capped-worker",
			"LLMQ_TEST_SCHEMA="+f.schema,
			fmt.Sprintf("LLMQ_TEST_WORKER=w%d", i),
			"DATABASE_URL="+dbtest.URL())
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}

	var dbPeak, freePeak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var capRunning, freeRunning int64
			err := f.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE tenant = 'capped'), count(*) FILTER (WHERE tenant = 'free')
				FROM %s.jobs WHERE state = 'RUNNING'`, f.schema)).Scan(&capRunning, &freeRunning)
			if err != nil {
				return
			}
			dbPeak.Store(max(dbPeak.Load(), capRunning))
			freePeak.Store(max(freePeak.Load(), freeRunning))
			var left int
			if err := f.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.jobs WHERE state <> 'SUCCEEDED'`, f.schema)).Scan(&left); err != nil || left == 0 {
				return
			}
		}
	}()
	for _, j := range append(capped, free...) {
		require.Equal(t, jobs.StateSucceeded, f.awaitIn(j.Tenant, j.ID).State)
	}
	<-sampled
	var handlerPeak int64
	require.NoError(t, f.pool.QueryRow(ctx, fmt.Sprintf("SELECT n FROM %s.peak", f.schema)).Scan(&handlerPeak))
	t.Logf("peak running for the capped tenant: %d in the database, %d in handlers; the uncapped tenant reached %d", dbPeak.Load(), handlerPeak, freePeak.Load())
	require.LessOrEqual(t, dbPeak.Load(), int64(5))
	require.LessOrEqual(t, handlerPeak, int64(5))
	require.Equal(t, int64(5), handlerPeak, "the cap was reached, so the test measured something")
	require.Greater(t, freePeak.Load(), int64(5), "the cap is the tenant's, not everyone's")
}

// runCappedWorker runs a runner of 20 workers whose handler records, in the
// database, how many jobs of the capped tenant run at once.
func runCappedWorker() int {
	return runChildRunner(func(pool *pgxpool.Pool, schema string) lease.Config {
		handler := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
			if job.Tenant == "capped" {
				if _, err := pool.Exec(ctx, fmt.Sprintf("INSERT INTO %s.live VALUES ($1)", schema), job.ID); err != nil {
					return nil, err
				}
				defer func() {
					_, _ = pool.Exec(context.WithoutCancel(ctx), fmt.Sprintf("DELETE FROM %s.live WHERE job_id = $1", schema), job.ID)
				}()
				if _, err := pool.Exec(ctx, fmt.Sprintf("UPDATE %[1]s.peak SET n = greatest(n, (SELECT count(*) FROM %[1]s.live))", schema)); err != nil {
					return nil, err
				}
			}
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
			}
			return json.RawMessage(`{}`), nil
		})
		return lease.Config{
			Handlers:     map[string]lease.Handler{"extract": handler},
			Queues:       map[string]lease.QueueConfig{lease.DefaultQueue: {MaxWorkers: 20}},
			WorkerID:     os.Getenv("LLMQ_TEST_WORKER"),
			PollInterval: 50 * time.Millisecond,
		}
	})
}

// A claim that marks a tenant idle while that tenant's enqueue is
// committing cannot see the new job. The enqueue's NOTIFY then brings the
// runner to a claim that comes up short, and the runner wakes the recently
// idled tenant at once instead of at the next poll-interval sweep (a minute
// here, past the test's patience). The race is set up by hand: the job is
// enqueued without a NOTIFY and its tenant marked idle in one commit, and
// the NOTIFY comes after.
func TestNotifyWakesATenantIdledByARacingClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	cfg := fastConfig(map[string]lease.Handler{"extract": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})})
	cfg.PollInterval = time.Minute
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.ReapInterval = 2*time.Minute, 20*time.Second, time.Minute
	f.start(cfg)
	warmUp := f.enqueue(jobs.EnqueueParams{Kind: "extract"})
	require.Equal(t, jobs.StateSucceeded, f.await(warmUp.ID).State, "the runner is up and listening")

	quiet, err := jobs.NewStore(jobs.Config{Schema: f.schema, DisableNotify: true})
	require.NoError(t, err)
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := quiet.Enqueue(ctx, tx, jobs.EnqueueParams{Tenant: "acme", Kind: "extract"})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE "+f.schema+".tenant_queues SET idle = true, updated_at = now()")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	_, err = f.pool.Exec(ctx, "SELECT pg_notify($1, 'default')", f.store.Channel())
	require.NoError(t, err)
	require.Equal(t, jobs.StateSucceeded, f.await(res.Job.ID).State)
}
