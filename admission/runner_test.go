package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// runnerConfig runs "extract" jobs under admission from pool, calling
// provider once per attempt.
func runnerConfig(l admission.Limiter, pool, provider, worker string) lease.Config {
	return lease.Config{
		Handlers: map[string]lease.Handler{"extract": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
			return providerCall(ctx, provider)
		})},
		WorkerID:          worker,
		LeaseDuration:     3 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		AttemptTimeout:    2 * time.Second,
		PollInterval:      100 * time.Millisecond,
		ReapInterval:      100 * time.Millisecond,
		ShutdownGrace:     2 * time.Second,
		Retry:             llmqtype.BackoffPolicy{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond},
		DeadlineMargin:    time.Second,
		Admission: &lease.Admission{
			Limiter: l,
			Route: func(job *jobs.Job) (admission.Request, bool) {
				return admission.Request{Pool: pool, Tenant: job.Tenant, Tokens: 100}, true
			},
			QueuePools: map[string][]string{jobs.DefaultQueue: {pool}},
			MaxWait:    200 * time.Millisecond,
		},
	}
}

// providerCall is a handler's model call, reporting the answer and usage
// as a handler under admission must.
func providerCall(ctx context.Context, url string) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, http.NoBody)
	if err != nil {
		return nil, lease.NotSent(err)
	}
	req.Header.Set("X-Max-Tokens", "100")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	lease.Responded(ctx, resp.StatusCode, resp.Header)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, jobs.RetryAfterHeader(fmt.Errorf("provider: %s", resp.Status), resp.Header.Get("Retry-After"))
	}
	var out struct{ Usage int64 }
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, jobs.InvalidOutput(err, body)
	}
	lease.RecordUsage(ctx, jobs.Usage{InputTokens: out.Usage})
	return body, nil
}

type runnerFixture struct {
	*fixture
	store *jobs.PostgresStore
}

func setupRunner(t *testing.T) *runnerFixture {
	t.Helper()
	f := setup(t)
	store, err := jobs.NewStore(jobs.Config{Schema: f.schema})
	require.NoError(t, err)
	return &runnerFixture{fixture: f, store: store}
}

func (f *runnerFixture) start(cfg lease.Config) {
	f.t.Helper()
	r, err := lease.NewRunner(f.pool, f.store, cfg)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	f.t.Cleanup(func() { cancel(); require.NoError(f.t, <-done) })
}

func (f *runnerFixture) enqueue(n, maxAttempts int) []uuid.UUID {
	f.t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		res, err := f.store.Enqueue(f.t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "extract", MaxAttempts: maxAttempts})
		require.NoError(f.t, err)
		ids[i] = res.Job.ID
	}
	return ids
}

func (f *runnerFixture) job(id uuid.UUID) *jobs.Job {
	f.t.Helper()
	j, err := f.store.Get(f.t.Context(), f.pool, "acme", id)
	require.NoError(f.t, err)
	return j
}

func (f *runnerFixture) awaitAll(ids []uuid.UUID, within time.Duration) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		for _, id := range ids {
			if !f.job(id).State.Terminal() {
				return false
			}
		}
		return true
	}, within, 20*time.Millisecond)
}

func okProvider(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"usage": 40}`)
	}))
	t.Cleanup(s.Close)
	return s
}

// While its pool cools down, a queue is not claimed from at all: the job
// is not leased and no attempt is spent; it runs once the cooldown ends.
func TestRunnerClaimsOnlyWhenAPermitIsNear(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "p", RPM: 6000, TPM: 1e6, MaxInFlight: 5}))
	require.NoError(t, f.pg.Cooldown(t.Context(), "p", 2*time.Second))
	ids := f.enqueue(1, 1)
	f.start(runnerConfig(f.pg, "p", okProvider(t).URL, "w"))

	time.Sleep(time.Second) // the claim that must not happen would happen in this second
	j := f.job(ids[0])
	require.Equal(t, jobs.StateReady, j.State)
	require.Zero(t, j.Attempt, "no lease was taken while no permit could be had")

	f.awaitAll(ids, 10*time.Second)
	j = f.job(ids[0])
	require.Equal(t, jobs.StateSucceeded, j.State)
	require.Equal(t, 1, j.Attempt)
}

// An attempt that would wait longer than MaxWait for its permit is
// snoozed: the job goes back to wait, the attempt is not counted (a job
// with MaxAttempts 1 is not failed), and the permit was never taken.
func TestRunnerSnoozesLongAdmissionWaits(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	// One request a minute and a burst of one: the second job waits.
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "slow", RPM: 1, TPM: 1e6, MaxInFlight: 5}))
	cfg := runnerConfig(f.pg, "slow", okProvider(t).URL, "w")
	cfg.Admission.QueuePools = nil // no gate: the attempt's own acquire decides
	ids := f.enqueue(2, 1)
	f.start(cfg)

	require.Eventually(t, func() bool {
		n := 0
		for _, id := range ids {
			j := f.job(id)
			if j.State == jobs.StateSucceeded || (j.State == jobs.StateRetryScheduled && j.Attempt >= 1) {
				n++
			}
		}
		return n == 2
	}, 10*time.Second, 20*time.Millisecond)
	var snoozed *jobs.Job
	for _, id := range ids {
		if j := f.job(id); j.State == jobs.StateRetryScheduled {
			snoozed = j
		}
	}
	require.NotNil(t, snoozed, "one job waits for the next minute's request")
	attempts, err := f.store.Attempts(t.Context(), f.pool, "acme", snoozed.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.AttemptSnoozed, attempts[0].Outcome)
	require.Contains(t, attempts[0].Error, "requests")
	require.Greater(t, snoozed.MaxAttempts, 1, "the snoozed attempt did not use up the only attempt")
	require.Greater(t, time.Until(snoozed.AvailableAt), 30*time.Second, "it waits for the request budget, about a minute")
	s, err := f.pg.State(t.Context(), "slow")
	require.NoError(t, err)
	require.Zero(t, s.InFlight)
}

// A job whose request is larger than its pool's burst can never run: it
// fails at once instead of waiting forever.
func TestRunnerFailsNeverAdmissibleJobs(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "small", RPM: 600, TPM: 600, MaxInFlight: 5, TokenBurst: 50}))
	ids := f.enqueue(1, 3)
	f.start(runnerConfig(f.pg, "small", okProvider(t).URL, "w"))
	f.awaitAll(ids, 10*time.Second)
	j := f.job(ids[0])
	require.Equal(t, jobs.StateFailedTerminal, j.State)
	require.Equal(t, 1, j.Attempt)
	require.Contains(t, j.LastError, "never be admitted")
}

// stormProvider answers 429 with Retry-After: 5 to every call arriving in
// the 300ms after its first call, then 200; it logs every arrival.
type stormProvider struct {
	mu       sync.Mutex
	first    time.Time
	arrivals []time.Time
	storm    int
}

func (p *stormProvider) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	p.mu.Lock()
	if p.first.IsZero() {
		p.first = now
	}
	p.arrivals = append(p.arrivals, now)
	inStorm := now.Sub(p.first) < 300*time.Millisecond
	if inStorm {
		p.storm++
	}
	p.mu.Unlock()
	if inStorm {
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	time.Sleep(20 * time.Millisecond)
	_, _ = io.WriteString(w, `{"usage": 60}`)
}

// runRunner is a runner process of the 429 storm test.
func runRunner(ctx context.Context, db *pgxpool.Pool, l *admission.Postgres) error {
	store, err := jobs.NewStore(jobs.Config{Schema: os.Getenv("LLMQ_TEST_SCHEMA")})
	if err != nil {
		return err
	}
	cfg := runnerConfig(l, "storm", os.Getenv("LLMQ_TEST_PROVIDER"), os.Getenv("LLMQ_TEST_WORKER"))
	cfg.Queues = map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 5}}
	r, err := lease.NewRunner(db, store, cfg)
	if err != nil {
		return err
	}
	fmt.Println("running")
	return r.Run(ctx)
}

// A 429 storm with Retry-After 5s against four runner processes: once the
// first 429 is answered, no process sends the pool a request until the
// cooldown is over, and every job hit by a 429 still succeeds although it
// was allowed a single attempt: the 429s were snoozes, not failures.
func TestRunner429StormCoolsDownEveryProcess(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "storm", RPM: 6000, TPM: 1e7, MaxInFlight: 10}))
	fake := &stormProvider{}
	provider := httptest.NewServer(fake)
	t.Cleanup(provider.Close)
	ids := f.enqueue(40, 1)

	for i := range 4 {
		_, out := startChild(t, f.fixture, "runner", "LLMQ_TEST_PROVIDER="+provider.URL, fmt.Sprintf("LLMQ_TEST_WORKER=runner-%d", i), "LLMQ_TEST_TTL=10s")
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "running\n", line)
	}
	f.awaitAll(ids, 40*time.Second)

	fake.mu.Lock()
	defer fake.mu.Unlock()
	require.Positive(t, fake.storm)
	// The first 429 was sent at fake.first; a process needs a moment to
	// read it and store the cooldown (calls already granted may still
	// land then). From then until the cooldown ends, nothing.
	quietFrom, quietUntil := fake.first.Add(time.Second), fake.first.Add(5*time.Second)
	for _, at := range fake.arrivals {
		require.False(t, at.After(quietFrom) && at.Before(quietUntil),
			"a request arrived %v after the first 429, during the cooldown", at.Sub(fake.first))
	}
	rateLimited := 0
	for _, id := range ids {
		j := f.job(id)
		require.Equal(t, jobs.StateSucceeded, j.State, "job %s", id)
		attempts, err := f.store.Attempts(t.Context(), f.pool, "acme", id)
		require.NoError(t, err)
		// Earlier attempts were all snoozes: 429s, or claims that then
		// found no permit within MaxWait (the cooldown, or 20 workers
		// contending for 10 slots after it).
		for _, a := range attempts[:len(attempts)-1] {
			require.Equal(t, jobs.AttemptSnoozed, a.Outcome)
			if strings.Contains(a.Error, "provider 429") {
				rateLimited++
				require.True(t, a.Usage.Uncertain, "a 429'd call may have been counted")
			} else {
				require.Contains(t, a.Error, "admission: pool busy")
			}
		}
	}
	require.Equal(t, fake.storm, rateLimited, "every 429 became a snooze, none a counted failure")
	inFlight, permits, err := f.pg.Counts(t.Context(), "storm")
	require.NoError(t, err)
	require.Equal(t, permits, inFlight)
}

func TestRunnerAdmissionConfig(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	good := runnerConfig(f.pg, "p", "http://127.0.0.1:1", "w")
	for want, mutate := range map[string]func(a *lease.Admission){
		"Limiter is nil":              func(a *lease.Admission) { a.Limiter = nil },
		"Route is nil":                func(a *lease.Admission) { a.Route = nil },
		"must not be negative":        func(a *lease.Admission) { a.MaxWait = -time.Second },
		"shorter than AttemptTimeout": func(a *lease.Admission) { a.MaxWait = time.Minute },
	} {
		cfg := good
		a := *good.Admission
		mutate(&a)
		cfg.Admission = &a
		_, err := lease.NewRunner(f.pool, f.store, cfg)
		require.ErrorIs(t, err, lease.ErrInvalidConfig, want)
		require.ErrorContains(t, err, want)
	}
	_, err := lease.NewRunner(f.pool, f.store, good)
	require.NoError(t, err)
}

// How an attempt ends decides how its permit is settled: an error marked
// CallNotSent refunds everything; an error after the call may have been sent
// spends the request and marks the attempt uncertain; an answer refunds
// the unused tokens.
func TestRunnerSettlesPermitsByOutcome(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	provider := okProvider(t)
	for _, tc := range []struct {
		name          string
		handler       lease.HandlerFunc
		wantRequests  float64
		wantTokens    float64
		wantUncertain bool
	}{
		{"not sent", func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, lease.NotSent(errors.New("document unreadable"))
		}, 10, 1000, false},
		{"lost after sending", func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, errors.New("connection reset")
		}, 9, 900, true},
		{"answered", func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
			return providerCall(ctx, provider.URL) // reports 40 tokens
		}, 9, 960, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			queue := strings.ReplaceAll(tc.name, " ", "-")
			pool := slow("settle " + tc.name)
			require.NoError(t, f.pg.SetPool(t.Context(), pool))
			cfg := runnerConfig(f.pg, pool.Name, provider.URL, "w")
			cfg.Handlers = map[string]lease.Handler{"extract": tc.handler}
			cfg.Queues = map[string]lease.QueueConfig{queue: {}}
			cfg.Admission.QueuePools = nil
			store, err := jobs.NewStore(jobs.Config{Schema: f.schema, Queues: []string{queue}})
			require.NoError(t, err)
			r, err := lease.NewRunner(f.pool, store, cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			defer func() { cancel(); require.NoError(t, <-done) }()

			res, err := store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "extract", Queue: queue, MaxAttempts: 1})
			require.NoError(t, err)
			f.awaitAll([]uuid.UUID{res.Job.ID}, 10*time.Second)
			s, err := f.pg.State(t.Context(), pool.Name)
			require.NoError(t, err)
			require.Zero(t, s.InFlight)
			require.InDelta(t, tc.wantRequests, s.RequestLevel, 0.1)
			require.InDelta(t, tc.wantTokens, s.TokenLevel, 1)
			attempts, err := store.Attempts(t.Context(), f.pool, "acme", res.Job.ID)
			require.NoError(t, err)
			require.Equal(t, tc.wantUncertain, attempts[0].Usage.Uncertain)
		})
	}
}

// While every in-flight slot of its pool is held, a queue is not claimed
// from: a lease would only sit waiting for a slot nobody can predict.
func TestRunnerDoesNotClaimForAFullPool(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "full", RPM: 6000, TPM: 1e6, MaxInFlight: 1}))
	held, err := f.pg.Acquire(t.Context(), admission.Request{Pool: "full"})
	require.NoError(t, err)
	ids := f.enqueue(1, 1)
	f.start(runnerConfig(f.pg, "full", okProvider(t).URL, "w"))

	time.Sleep(time.Second) // the claim that must not happen would happen in this second
	require.Zero(t, f.job(ids[0]).Attempt, "no lease was taken while the pool was full")

	require.NoError(t, held.Release(t.Context(), admission.CallOutcome{Result: admission.CallNotSent}))
	f.awaitAll(ids, 10*time.Second)
	j := f.job(ids[0])
	require.Equal(t, jobs.StateSucceeded, j.State)
	require.Equal(t, 1, j.Attempt)
}

// A handler that panics still gives its permit back, as uncertain.
func TestRunnerReleasesPermitOnPanic(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	pool := slow("panics")
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	cfg := runnerConfig(f.pg, pool.Name, "http://127.0.0.1:1", "w")
	cfg.Handlers = map[string]lease.Handler{"extract": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		panic("handler bug")
	})}
	ids := f.enqueue(1, 1)
	f.start(cfg)
	f.awaitAll(ids, 10*time.Second)
	s, err := f.pg.State(t.Context(), pool.Name)
	require.NoError(t, err)
	require.Zero(t, s.InFlight, "the slot is back at once, not after the permit's expiry")
	require.InDelta(t, 9, s.RequestLevel, 0.1, "the call may have been sent: no refund")
}

// flushSignal is the Postgres limiter with a signal when the runner starts
// to flush it.
type flushSignal struct {
	*admission.Postgres
	flushing chan struct{}
}

func (l *flushSignal) Flush(ctx context.Context) error {
	close(l.flushing)
	return l.Postgres.Flush(ctx)
}

// An acquire the shutdown cancels after its cycle took it is granted by
// that cycle and given back in a later one. Run returns only after the
// give-back ran, so a process that exits when Run returns leaves no permit
// holding a slot until it expires.
func TestRunnerShutdownWaitsForTheLimitersGiveBacks(t *testing.T) {
	t.Parallel()
	f := setupRunner(t)
	ctx := t.Context()
	pool := admission.Pool{Name: "flushed", RPM: 6000, TPM: 1e6, MaxInFlight: 4}
	require.NoError(t, f.pg.SetPool(ctx, pool))
	limiter := &flushSignal{Postgres: f.pg, flushing: make(chan struct{})}

	// Hold the pool row, so that the attempt's acquire waits inside its
	// cycle, past the point where leaving the queue would take nothing.
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var holder int32
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder))
	_, err = tx.Exec(ctx, fmt.Sprintf("SELECT 1 FROM %s.admission_pools WHERE name = $1 FOR UPDATE", f.schema), pool.Name)
	require.NoError(t, err)

	ids := f.enqueue(1, 3)
	cfg := runnerConfig(limiter, pool.Name, okProvider(t).URL, "w")
	cfg.ShutdownGrace = 50 * time.Millisecond
	r, err := lease.NewRunner(f.pool, f.store, cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	require.Eventually(t, func() bool {
		var waiting int
		err := f.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", holder).Scan(&waiting)
		return err == nil && waiting > 0
	}, 10*time.Second, 5*time.Millisecond, "the attempt's acquire waits for the pool row")

	stop() // the grace ends while the acquire waits: it is cancelled
	select {
	case <-limiter.flushing:
	case err := <-done:
		t.Fatalf("Run returned (%v) without flushing the limiter, while a cycle it queued was still running", err)
	}
	require.NoError(t, tx.Rollback(ctx)) // the cycle grants, then the give-back runs
	require.NoError(t, <-done)

	// Nothing is left for a process exiting now to lose.
	require.NoError(t, f.pg.Flush(canceled(ctx)), "nothing queued once Run returned")
	s, err := f.pg.State(ctx, pool.Name)
	require.NoError(t, err)
	require.Zero(t, s.InFlight, "the slot granted to the cancelled acquire is back")
	var permits int
	require.NoError(t, f.pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.admission_permits", f.schema)).Scan(&permits))
	require.Zero(t, permits)
	require.Equal(t, jobs.StateRetryScheduled, f.job(ids[0]).State, "the job was given back at shutdown")
}

func canceled(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return ctx
}
