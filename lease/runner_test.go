package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	store  *jobs.PostgresStore
	schema string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 12})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	return &fixture{t: t, pool: db.Pool, store: store, schema: db.Schema}
}

// fastConfig is a runner configuration with short timings for tests.
func fastConfig(handlers map[string]lease.Handler) lease.Config {
	return lease.Config{
		Handlers:          handlers,
		LeaseDuration:     3 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		AttemptTimeout:    2 * time.Second,
		PollInterval:      100 * time.Millisecond,
		ReapInterval:      100 * time.Millisecond,
		ShutdownGrace:     2 * time.Second,
		Retry:             llmqtype.BackoffPolicy{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond},
		DeadlineMargin:    time.Second,
	}
}

// start runs a runner until the test ends (or stop is called) and returns
// stop, which cancels it and returns Run's error.
func (f *fixture) start(cfg lease.Config) (*lease.Runner, func() error) {
	return f.startWith(f.store, cfg)
}

func (f *fixture) startWith(store jobs.RunnerStore, cfg lease.Config) (*lease.Runner, func() error) {
	f.t.Helper()
	r, err := lease.NewRunner(f.pool, store, cfg)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	f.t.Cleanup(func() { _ = stop() })
	return r, stop
}

func (f *fixture) enqueue(p jobs.EnqueueParams) *jobs.Job {
	f.t.Helper()
	if p.Tenant == "" {
		p.Tenant = "acme"
	}
	res, err := f.store.Enqueue(f.t.Context(), f.pool, p)
	require.NoError(f.t, err)
	return res.Job
}

// await waits until the job reaches a terminal state and returns it.
func (f *fixture) await(id uuid.UUID) *jobs.Job {
	f.t.Helper()
	return f.awaitIn("acme", id)
}

// awaitIn is await for a job of another tenant.
func (f *fixture) awaitIn(tenant string, id uuid.UUID) *jobs.Job {
	f.t.Helper()
	var job *jobs.Job
	require.Eventually(f.t, func() bool {
		j, err := f.store.Get(f.t.Context(), f.pool, tenant, id)
		require.NoError(f.t, err)
		job = j
		return j.State.Terminal()
	}, 15*time.Second, 10*time.Millisecond, "job %s did not finish", id)
	return job
}

func (f *fixture) attempts(id uuid.UUID) []jobs.Attempt {
	f.t.Helper()
	attempts, err := f.store.Attempts(f.t.Context(), f.pool, "acme", id)
	require.NoError(f.t, err)
	return attempts
}

func TestNewRunnerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ok := map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return nil, nil })}
	tests := map[string]lease.Config{
		"Handlers is empty":                          {},
		"must be shorter than LeaseDuration (1m30s)": {Handlers: ok, HeartbeatInterval: 90 * time.Second},
		"an attempt must end before":                 {Handlers: ok, AttemptTimeout: 2 * time.Minute},
		"MaxWorkers is -1":                           {Handlers: ok, Queues: map[string]lease.QueueConfig{"default": {MaxWorkers: -1}}},
		"LeaseDuration is 500ms":                     {Handlers: ok, LeaseDuration: 500 * time.Millisecond},
		"Retry":                                      {Handlers: ok, Retry: llmqtype.BackoffPolicy{Base: -time.Second}},
		"PollInterval is -1s":                        {Handlers: ok, PollInterval: -time.Second},
	}
	for want, cfg := range tests {
		_, err := lease.NewRunner(f.pool, f.store, cfg)
		require.ErrorIs(t, err, lease.ErrInvalidConfig, want)
		require.ErrorContains(t, err, want)
	}
	_, err := lease.NewRunner(nil, f.store, lease.Config{Handlers: ok})
	require.ErrorIs(t, err, lease.ErrInvalidConfig)
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var timeouts atomic.Int32
	handlers := map[string]lease.Handler{
		"ok": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
			lease.RecordUsage(ctx, jobs.Usage{InputTokens: 1200, OutputTokens: 80})
			return json.RawMessage(`{"total":"42.00"}`), nil
		}),
		"panics": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			panic("nil map in the parser")
		}),
		"permanent": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.Permanent(errors.New("400: unsupported document type"))
		}),
		"invalid": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.InvalidOutput(errors.New("line items do not sum to the total"), json.RawMessage(`{"total":"41.00"}`))
		}),
		"review": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.NeedsReview(json.RawMessage(`{"total":"9.99"}`), "currency unclear")
		}),
		"slow": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
			if job.Attempt == 1 {
				<-ctx.Done() // the attempt timeout fires
				timeouts.Add(1)
				return nil, ctx.Err()
			}
			return json.RawMessage(`{}`), nil
		}),
		"late": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.RetryAfter(errors.New("429: slow down"), 10*time.Second)
		}),
	}
	cfg := fastConfig(handlers)
	cfg.AttemptTimeout = 300 * time.Millisecond
	f.start(cfg)

	ok := f.enqueue(jobs.EnqueueParams{Kind: "ok"})
	panics := f.enqueue(jobs.EnqueueParams{Kind: "panics", MaxAttempts: 2})
	permanent := f.enqueue(jobs.EnqueueParams{Kind: "permanent"})
	invalid := f.enqueue(jobs.EnqueueParams{Kind: "invalid"})
	review := f.enqueue(jobs.EnqueueParams{Kind: "review"})
	slow := f.enqueue(jobs.EnqueueParams{Kind: "slow"})
	late := f.enqueue(jobs.EnqueueParams{Kind: "late", DeadlineAt: time.Now().Add(5 * time.Second)})

	job := f.await(ok.ID)
	require.Equal(t, jobs.StateSucceeded, job.State)
	require.JSONEq(t, `{"total":"42.00"}`, string(job.Result))
	attempts := f.attempts(ok.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.Usage{InputTokens: 1200, OutputTokens: 80}, attempts[0].Usage)

	job = f.await(panics.ID)
	require.Equal(t, jobs.StateFailedTerminal, job.State, "a panic is a failed attempt, retried until attempts run out")
	require.Equal(t, jobs.ClassPanic, job.ErrorClass)
	attempts = f.attempts(panics.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.AttemptRetryScheduled, attempts[0].Outcome)
	require.Contains(t, attempts[0].Error, "nil map in the parser")
	require.Equal(t, jobs.AttemptFailed, attempts[1].Outcome)

	job = f.await(permanent.ID)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Equal(t, jobs.ClassPermanent, job.ErrorClass)
	require.Len(t, f.attempts(permanent.ID), 1, "no retry of a permanent failure")

	job = f.await(invalid.ID)
	require.Equal(t, jobs.StateReviewRequired, job.State, "invalid output retries once, then goes to review")
	require.JSONEq(t, `{"total":"41.00"}`, string(job.Result))
	attempts = f.attempts(invalid.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.ClassInvalidOutput, attempts[0].ErrorClass)
	require.Equal(t, jobs.AttemptReviewRequired, attempts[1].Outcome)

	job = f.await(review.ID)
	require.Equal(t, jobs.StateReviewRequired, job.State)
	require.Equal(t, "currency unclear", job.LastError)

	job = f.await(slow.ID)
	require.Equal(t, jobs.StateSucceeded, job.State)
	require.Equal(t, int32(1), timeouts.Load(), "the first attempt's context was cancelled by the timeout")
	attempts = f.attempts(slow.ID)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.ClassTimeout, attempts[0].ErrorClass)
	require.True(t, attempts[0].Usage.Uncertain, "a timed-out call may have been billed")

	job = f.await(late.ID)
	require.Equal(t, jobs.StateFailedTerminal, job.State, "a Retry-After beyond the deadline is refused")
	require.Equal(t, jobs.ClassDeadline, job.ErrorClass)
	require.Len(t, f.attempts(late.ID), 1)
}

// A job with a budget of one attempt is snoozed twice and then succeeds:
// snoozes do not spend the retry budget, each is recorded on its attempt row
// with its reason, and the handler's middleware sees the usage it reported.
func TestSnoozeKeepsTheRetryBudget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var seen atomic.Int64
	handlers := map[string]lease.Handler{
		"gated": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
			lease.RecordUsage(ctx, jobs.Usage{InputTokens: 7})
			seen.Store(lease.UsageOf(ctx).InputTokens)
			if job.Attempt < 3 {
				return nil, &jobs.SnoozeError{After: 20 * time.Millisecond, Reason: "no permit"}
			}
			return json.RawMessage(`{}`), nil
		}),
	}
	f.start(fastConfig(handlers))
	enqueued := f.enqueue(jobs.EnqueueParams{Kind: "gated", MaxAttempts: 1})

	job := f.await(enqueued.ID)
	require.Equal(t, jobs.StateSucceeded, job.State)
	require.Equal(t, 3, job.Attempt)
	require.Equal(t, 3, job.MaxAttempts, "each snooze gave its attempt back")
	require.Empty(t, job.ErrorClass)
	attempts := f.attempts(enqueued.ID)
	require.Len(t, attempts, 3)
	for _, a := range attempts[:2] {
		require.Equal(t, jobs.AttemptSnoozed, a.Outcome)
		require.Equal(t, "snoozed for 20ms: no permit", a.Error)
		require.False(t, a.RetryAt.IsZero(), "the snooze persisted when to run again")
	}
	require.Equal(t, jobs.AttemptSucceeded, attempts[2].Outcome)
	require.Equal(t, int64(7), seen.Load())
	require.Equal(t, jobs.Usage{}, lease.UsageOf(t.Context()), "no attempt, no usage")
}

// The invalid-output budget (the default 2) counts malformed answers only:
// a snooze and a transient failure before the first malformed answer leave
// it whole, so that answer is retried, and the second malformed answer
// spends it.
func TestInvalidOutputBudgetCountsOnlyInvalidAnswers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	handlers := map[string]lease.Handler{
		"gated": lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
			switch job.Attempt {
			case 1:
				return nil, jobs.Snooze(10 * time.Millisecond)
			case 2:
				return nil, errors.New("connection reset")
			default:
				return nil, jobs.InvalidOutput(errors.New("not JSON"), json.RawMessage(`"{total: 42"`))
			}
		}),
	}
	f.start(fastConfig(handlers)) // InvalidOutputAttempts: the default, 2
	enqueued := f.enqueue(jobs.EnqueueParams{Kind: "gated"})

	job := f.await(enqueued.ID)
	require.Equal(t, jobs.StateReviewRequired, job.State)
	require.Equal(t, 4, job.Attempt, "the first malformed answer (attempt 3) was retried, the second went to review")
	outcomes := []jobs.AttemptOutcome{}
	for _, a := range f.attempts(enqueued.ID) {
		outcomes = append(outcomes, a.Outcome)
	}
	require.Equal(t, []jobs.AttemptOutcome{jobs.AttemptSnoozed, jobs.AttemptRetryScheduled, jobs.AttemptRetryScheduled, jobs.AttemptReviewRequired}, outcomes)
}

// pausingStore drops heartbeats while paused, as a worker stalled by a long
// GC pause or a network partition would. Everything else reaches the real
// store.
type pausingStore struct {
	jobs.RunnerStore
	paused atomic.Bool
}

func (s *pausingStore) Heartbeat(ctx context.Context, db jobs.DBTX, worker string, d time.Duration, leases []jobs.Lease) (jobs.HeartbeatResult, error) {
	if s.paused.Load() {
		return jobs.HeartbeatResult{}, errors.New("paused")
	}
	return s.RunnerStore.Heartbeat(ctx, db, worker, d, leases)
}

// Runner A stalls past its lease while its handler holds the job; runner B
// takes the job over and succeeds. A's late success is discarded: B's
// result stands and A's attempt is recorded as stale.
func TestStalledRunnerCannotOverwrite(t *testing.T) {
	t.Parallel()
	f := setup(t)
	aStarted, aRelease := make(chan struct{}), make(chan struct{})
	stalled := &pausingStore{RunnerStore: f.store}
	cfgA := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		close(aStarted)
		<-aRelease // stalled: ignores its context
		return json.RawMessage(`{"by":"a"}`), nil
	})})
	// A's own view of its lease is long, so that however slow a loaded
	// machine makes the test, A still sends its late completion and tries
	// it until it is recorded; the database's view is cut short below.
	cfgA.LeaseDuration, cfgA.AttemptTimeout = 30*time.Second, 20*time.Second
	cfgA.ReapInterval = time.Hour // only B reaps
	cfgA.WorkerID = "runner-a"
	cfgA.Queues = map[string]lease.QueueConfig{"default": {MaxWorkers: 1}} // its one slot stays stuck
	_, stopA := f.startWith(stalled, cfgA)

	job := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	<-aStarted
	stalled.paused.Store(true)
	_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".jobs SET lease_until = now() WHERE id = $1", job.ID)
	require.NoError(t, err)

	cfgB := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		return json.RawMessage(`{"by":"b"}`), nil
	})})
	cfgB.WorkerID = "runner-b"
	f.start(cfgB)
	done := f.await(job.ID)
	require.JSONEq(t, `{"by":"b"}`, string(done.Result))

	close(aRelease)
	require.Eventually(t, func() bool {
		a := f.attempts(job.ID)
		return len(a) == 2 && a[0].Outcome == jobs.AttemptStale
	}, 5*time.Second, 10*time.Millisecond, "A's completion arrives and is recorded as stale")
	require.NoError(t, stopA())

	final, err := f.store.Get(t.Context(), f.pool, "acme", job.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"by":"b"}`, string(final.Result), "B's result stands")
	require.Equal(t, jobs.StateSucceeded, final.State)
	attempts := f.attempts(job.ID)
	require.Equal(t, "runner-a", attempts[0].Worker)
	require.Equal(t, "runner-b", attempts[1].Worker)
	require.Equal(t, jobs.AttemptSucceeded, attempts[1].Outcome)
}

// Four runners work 1,000 jobs; no job is ever live in two attempts at once,
// and every job succeeds exactly once.
func TestNoJobRunsTwiceAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const total, runners = 1000, 4
	var (
		mu        sync.Mutex
		live      = map[uuid.UUID]bool{} // the side table of live attempts
		overlaps  int
		successes = map[uuid.UUID]int{}
	)
	handler := lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		mu.Lock()
		if live[job.ID] {
			overlaps++
		}
		live[job.ID] = true
		mu.Unlock()
		time.Sleep(time.Duration(job.ID[15]%3) * time.Millisecond) // simulated work, of varying length
		mu.Lock()
		delete(live, job.ID)
		successes[job.ID]++
		mu.Unlock()
		return nil, nil
	})
	params := make([]jobs.EnqueueParams, total)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k"}
	}
	_, err := f.store.EnqueueMany(t.Context(), f.pool, params)
	require.NoError(t, err)

	for i := range runners {
		cfg := fastConfig(map[string]lease.Handler{"k": handler})
		cfg.WorkerID = fmt.Sprintf("runner-%d", i)
		cfg.Queues = map[string]lease.QueueConfig{"default": {MaxWorkers: 8}}
		db := dbtest.Pool(t, 6)
		r, err := lease.NewRunner(db, f.store, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".jobs WHERE state = 'SUCCEEDED'").Scan(&n))
		return n == total
	}, 60*time.Second, 50*time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, overlaps, "no job was live in two attempts at once")
	require.Len(t, successes, total)
	for id, n := range successes {
		require.Equal(t, 1, n, "job %s ran to success once", id)
	}
	var attempts int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".job_attempts").Scan(&attempts))
	require.Equal(t, total, attempts, "one attempt per job: nothing was claimed twice")
}

// On shutdown, attempts that finish within the grace period are recorded;
// the rest are cancelled and released at once for another runner, never
// left RUNNING under a dead owner.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started := make(chan uuid.UUID, 10)
	handlers := map[string]lease.Handler{
		"quick": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
			started <- job.ID
			time.Sleep(50 * time.Millisecond)
			return json.RawMessage(`{}`), nil
		}),
		"stuck": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
			started <- job.ID
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}),
	}
	cfg := fastConfig(handlers)
	cfg.ShutdownGrace = 300 * time.Millisecond
	cfg.WorkerID = "leaving"
	_, stop := f.start(cfg)

	quick := f.enqueue(jobs.EnqueueParams{Kind: "quick"})
	stuck := []*jobs.Job{f.enqueue(jobs.EnqueueParams{Kind: "stuck"}), f.enqueue(jobs.EnqueueParams{Kind: "stuck"})}
	for range 3 {
		<-started
	}
	require.NoError(t, stop())

	var running int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".jobs WHERE state = 'RUNNING'").Scan(&running))
	require.Zero(t, running, "no job is left RUNNING with a dead owner")

	got, err := f.store.Get(t.Context(), f.pool, "acme", quick.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateSucceeded, got.State, "an attempt that finished within the grace period is recorded")
	for _, j := range stuck {
		got, err := f.store.Get(t.Context(), f.pool, "acme", j.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StateRetryScheduled, got.State)
		require.False(t, got.AvailableAt.After(time.Now()), "released for another runner at once")
		attempts := f.attempts(j.ID)
		require.Equal(t, jobs.AttemptReleased, attempts[0].Outcome)
		require.True(t, attempts[0].Usage.Uncertain)
	}

	// Another runner picks the released jobs up.
	cfg.Handlers["stuck"] = lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return nil, nil })
	cfg.WorkerID = "successor"
	f.start(cfg)
	for _, j := range stuck {
		require.Equal(t, jobs.StateSucceeded, f.await(j.ID).State)
	}
}

// cancelOnClaim cancels the runner's context as its first successful claim
// returns: shutdown begins while the claimed jobs are in the runner's hands.
type cancelOnClaim struct {
	jobs.RunnerStore
	cancel context.CancelFunc
	once   sync.Once
}

func (s *cancelOnClaim) Claim(ctx context.Context, db jobs.DBTX, p jobs.ClaimParams) ([]*jobs.Job, error) {
	claimed, err := s.RunnerStore.Claim(ctx, db, p)
	if len(claimed) > 0 {
		s.once.Do(s.cancel)
	}
	return claimed, err
}

// Jobs claimed just as shutdown begins are run or released, never left
// RUNNING for their leases to expire.
func TestShutdownDuringAClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for range 3 {
		f.enqueue(jobs.EnqueueParams{Kind: "quick"})
	}
	cfg := fastConfig(map[string]lease.Handler{"quick": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})})
	cfg.LeaseDuration, cfg.HeartbeatInterval = time.Minute, 10*time.Second
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r, err := lease.NewRunner(f.pool, &cancelOnClaim{RunnerStore: f.store, cancel: cancel}, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Run(ctx))

	var running int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".jobs WHERE state = 'RUNNING'").Scan(&running))
	require.Zero(t, running, "no claimed job is left RUNNING after Run returned")
}

func TestCancelRunningJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started := make(chan struct{})
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		close(started)
		<-ctx.Done()
		return nil, context.Cause(ctx)
	})})
	f.start(cfg)
	job := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	<-started
	_, err := f.store.Cancel(t.Context(), f.pool, "acme", job.ID)
	require.NoError(t, err)
	got := f.await(job.ID)
	require.Equal(t, jobs.StateCancelled, got.State)
	attempts := f.attempts(job.ID)
	require.Equal(t, jobs.AttemptCancelled, attempts[0].Outcome)
	require.Contains(t, attempts[0].Error, "cancellation requested")
}

func TestOnSucceededJoinsTheCompletion(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".deliveries (job_id uuid PRIMARY KEY)")
	require.NoError(t, err)
	var failures atomic.Int32
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{"ok":true}`), nil }),
	})
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		if job.Payload != nil && string(job.Payload) == `{"fail": true}` {
			failures.Add(1)
			return errors.New("delivery table unavailable")
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".deliveries (job_id) VALUES ($1)", job.ID)
		return err
	}
	f.start(cfg)

	good := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	require.Equal(t, jobs.StateSucceeded, f.await(good.ID).State)
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".deliveries WHERE job_id = $1", good.ID).Scan(&n))
	require.Equal(t, 1, n, "the hook's write committed with the success")

	bad := f.enqueue(jobs.EnqueueParams{Kind: "k", Payload: json.RawMessage(`{"fail": true}`), MaxAttempts: 1})
	got := f.await(bad.ID)
	require.Equal(t, jobs.StateFailedTerminal, got.State, "a success whose hook keeps failing is not recorded as a success")
	require.Contains(t, got.LastError, "delivery table unavailable")
	require.GreaterOrEqual(t, failures.Load(), int32(3))
}

// A hook that stalls outside the database, ignoring its context, holds the
// completion transaction open: Postgres ends it after the completion
// timeout (a third of the lease), so its jobs' rows are not locked for
// longer, and the outcome is recorded again, with the hook's write once.
func TestStalledOnSucceededReleasesItsRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".deliveries (job_id uuid PRIMARY KEY)")
	require.NoError(t, err)
	stalled, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }),
	})
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		if calls.Add(1) == 1 {
			close(stalled)
			<-release // a call that ignores ctx
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".deliveries (job_id) VALUES ($1)", job.ID)
		return err
	}
	f.start(cfg)
	var once sync.Once
	unstall := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unstall) // before the runner stops, whatever happens
	job := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	<-stalled

	// The job's row is locked by the stalled transaction until Postgres
	// ends it; without the bound this waits out its own lock_timeout.
	started := time.Now()
	err = pgx.BeginFunc(t.Context(), f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), "SELECT 1 FROM "+f.schema+".jobs WHERE id = $1 FOR UPDATE", job.ID)
		return err
	})
	require.NoError(t, err, "the row stayed locked by the stalled hook's transaction")
	require.Less(t, time.Since(started), 8*time.Second)
	unstall()

	require.Equal(t, jobs.StateSucceeded, f.await(job.ID).State)
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".deliveries WHERE job_id = $1", job.ID).Scan(&n))
	require.Equal(t, 1, n, "the stalled transaction's write did not commit; the retry's did")
}

// A heartbeat that finds the lease gone cancels the handler's context at
// once, with ErrLeaseLost as the cause.
func TestLostLeaseCancelsTheHandler(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started, cause := make(chan struct{}), make(chan error, 1)
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	})})
	cfg.ReapInterval = time.Hour
	f.start(cfg)
	job := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	<-started
	// Another party took the job over: the fence moved on.
	_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".jobs SET fence = fence + 1 WHERE id = $1", job.ID)
	require.NoError(t, err)
	select {
	case err := <-cause:
		require.ErrorIs(t, err, lease.ErrLeaseLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled after its lease was lost")
	}
}

// signalledConfig is a runner of kind "k" that polls only hourly, so that
// only a signal (NOTIFY or Wake) makes it claim; each job's id is sent on
// started when its handler runs.
func signalledConfig() (chan uuid.UUID, lease.Config) {
	started := make(chan uuid.UUID, 2)
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		started <- job.ID
		return nil, nil
	})})
	cfg.PollInterval = time.Hour
	return started, cfg
}

// With polling effectively off, only NOTIFY wakes the runner. After its
// LISTEN connection is killed, it reconnects and wakes again.
func TestListenReconnects(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started, cfg := signalledConfig()
	f.start(cfg)
	listening := func() int {
		var pid int
		err := f.pool.QueryRow(t.Context(), `SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE query = 'LISTEN '||$1::text`,
			pgx.Identifier{f.store.Channel()}.Sanitize()).Scan(&pid)
		require.NoError(t, err)
		return pid
	}
	var pid int
	require.Eventually(t, func() bool { pid = listening(); return pid != 0 }, 5*time.Second, 10*time.Millisecond)

	first := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	require.Equal(t, first.ID, <-started, "woken by NOTIFY")

	_, err := f.pool.Exec(t.Context(), "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	require.Eventually(t, func() bool { p := listening(); return p != 0 && p != pid }, 10*time.Second, 10*time.Millisecond, "LISTEN is re-established")

	second := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	select {
	case id := <-started:
		require.Equal(t, second.ID, id)
	case <-time.After(5 * time.Second):
		t.Fatal("the runner was not woken after its LISTEN connection was replaced")
	}
}

// A host whose job signals arrive on a broker turns LISTEN off and wakes the
// runner itself: without a wake-up (and with polling an hour apart) a new
// job waits; Wake claims it at once.
func TestWakeReplacesListen(t *testing.T) {
	t.Parallel()
	f := setup(t)
	started, cfg := signalledConfig()
	cfg.DisableListen = true
	first := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	// The second job becomes claimable a second from now, well after the
	// runner's brief fast polling that follows a claim: only a signal or a
	// poll could find it then.
	availableAt := time.Now().Add(time.Second)
	second := f.enqueue(jobs.EnqueueParams{Kind: "k", AvailableAt: availableAt})
	r, _ := f.start(cfg)
	require.Equal(t, first.ID, <-started, "the first claim at start finds committed work")
	require.False(t, r.Wake("no-such-queue"))

	require.Never(t, func() bool { return len(started) > 0 }, time.Until(availableAt)+time.Second, 20*time.Millisecond,
		"with LISTEN off and no poll due, nothing claims the job once it is due")
	var listeners int
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN '||$1::text`,
		pgx.Identifier{f.store.Channel()}.Sanitize()).Scan(&listeners))
	require.Zero(t, listeners)

	require.True(t, r.Wake(jobs.DefaultQueue))
	select {
	case id := <-started:
		require.Equal(t, second.ID, id)
	case <-time.After(5 * time.Second):
		t.Fatal("Wake did not make the runner claim")
	}
}

// The runner's database connections are killed while attempts are in
// flight (a failover, pg_terminate_backend): their outcomes are still
// recorded, on fresh connections.
func TestOutcomesSurviveKilledConnections(t *testing.T) {
	t.Parallel()
	f := setup(t)
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	app := "llmq-runner-" + f.schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 4
	runnerPool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(runnerPool.Close)

	release := make(chan struct{})
	var started atomic.Int32
	rcfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		started.Add(1)
		<-release
		return json.RawMessage(`{"ok":true}`), nil
	})})
	r, err := lease.NewRunner(runnerPool, f.store, rcfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	var ids []uuid.UUID
	for range 3 {
		ids = append(ids, f.enqueue(jobs.EnqueueParams{Kind: "k"}).ID)
	}
	require.Eventually(t, func() bool { return started.Load() == 3 }, 5*time.Second, 5*time.Millisecond)

	var killed int
	require.NoError(t, f.pool.QueryRow(t.Context(),
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&killed))
	require.Positive(t, killed, "the runner's connections were killed")
	close(release)

	for _, id := range ids {
		require.Equal(t, jobs.StateSucceeded, f.await(id).State)
	}
}
