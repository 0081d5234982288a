package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// barrier holds every handler until n of them have started, so that their
// outcomes reach the completer together and share a batch.
type barrier struct {
	n       int32
	started atomic.Int32
	all     chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: int32(n), all: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) {
	if b.started.Add(1) == b.n {
		close(b.all)
	}
	select {
	case <-b.all:
	case <-ctx.Done():
	}
}

// runBatch enqueues n jobs of kind "k" and runs them in one claim with
// handler, all outcomes arriving together; it returns the jobs as they
// ended and how often the handler was called.
func runBatch(t *testing.T, f *fixture, n int, handler func(i int) (json.RawMessage, error)) ([]*jobs.Job, int) {
	t.Helper()
	params := make([]jobs.EnqueueParams, n)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	res, err := f.store.EnqueueMany(t.Context(), f.pool, params)
	require.NoError(t, err)
	b := newBarrier(n)
	var calls atomic.Int32
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		calls.Add(1)
		var in struct{ I int }
		if err := json.Unmarshal(job.Payload, &in); err != nil {
			return nil, err
		}
		b.wait(ctx)
		return handler(in.I)
	})})
	cfg.ClaimBatch = n
	cfg.Queues = map[string]lease.QueueConfig{"default": {MaxWorkers: n}}
	cfg.Logger = slog.New(slog.DiscardHandler)
	_, stop := f.start(cfg)
	out := make([]*jobs.Job, n)
	for i, r := range res {
		out[i] = f.await(r.Job.ID)
	}
	require.NoError(t, stop())
	for _, j := range out {
		require.Equal(t, out[0].AttemptedAt, j.AttemptedAt, "all jobs were claimed in one claim")
	}
	return out, int(calls.Load())
}

// One handler returning a result that is not JSON, among 100 jobs claimed
// and completed together, costs only its own job: the 99 others succeed on
// their first attempt, nothing runs twice, and the bad job fails on its
// first attempt as a handler defect, its output kept as text. So does one
// whose JSON jsonb cannot hold (a number beyond numeric's range).
func TestOneBadResultHarmsOnlyItsJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const n, bad, huge = 100, 37, 61
	ended, calls := runBatch(t, f, n, func(i int) (json.RawMessage, error) {
		switch i {
		case bad:
			return json.RawMessage(`Sure! Here is the invoice: {"total": 41`), nil
		case huge:
			return json.RawMessage(`{"total":1e1000000}`), nil
		}
		return json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), nil
	})
	require.Equal(t, n, calls, "no job ran twice")
	h := ended[huge]
	require.Equal(t, jobs.StateFailedTerminal, h.State)
	require.Equal(t, jobs.ClassHandlerDefect, h.ErrorClass)
	require.Contains(t, h.LastError, "numeric's range")
	for i, j := range ended {
		if i == huge {
			continue
		}
		if i == bad {
			continue
		}
		require.Equal(t, jobs.StateSucceeded, j.State, "job %d", i)
		require.Equal(t, 1, j.Attempt, "job %d succeeded on its first attempt", i)
		require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(j.Result))
	}
	j := ended[bad]
	require.Equal(t, jobs.StateFailedTerminal, j.State)
	require.Equal(t, jobs.ClassHandlerDefect, j.ErrorClass)
	require.Equal(t, 1, j.Attempt)
	require.Contains(t, j.LastError, "not JSON")
	var text string
	require.NoError(t, json.Unmarshal(j.Result, &text))
	require.Equal(t, `Sure! Here is the invoice: {"total": 41`, text)
	attempts := f.attempts(j.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptFailed, attempts[0].Outcome)
	require.Equal(t, jobs.ClassHandlerDefect, attempts[0].ErrorClass)
}

// An outcome that passes every check but that PostgreSQL refuses (here a
// constraint of the host's own on results) fails its batch's statement;
// the batch is then recorded job by job, and only that job fails, as
// unrecordable.
func TestRefusedOutcomeHarmsOnlyItsJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.pool.Exec(t.Context(), "ALTER TABLE "+f.schema+".jobs ADD CONSTRAINT result_not_poisoned CHECK (NOT coalesce(result ? 'poison', false))")
	require.NoError(t, err)
	const n, bad = 20, 5
	ended, calls := runBatch(t, f, n, func(i int) (json.RawMessage, error) {
		if i == bad {
			return json.RawMessage(`{"poison":true}`), nil
		}
		return json.RawMessage(`{}`), nil
	})
	require.Equal(t, n, calls, "no job ran twice")
	for i, j := range ended {
		if i == bad {
			continue
		}
		require.Equal(t, jobs.StateSucceeded, j.State, "job %d", i)
		require.Equal(t, 1, j.Attempt, "job %d", i)
	}
	j := ended[bad]
	require.Equal(t, jobs.StateFailedTerminal, j.State)
	require.Equal(t, jobs.ClassUnrecordable, j.ErrorClass)
	require.Equal(t, 1, j.Attempt)
	require.Contains(t, j.LastError, "result_not_poisoned")
}

// A model's raw answer carried by InvalidOutput or NeedsReview is stored
// as text when it is not JSON, so the job shows what the model said: in
// REVIEW_REQUIRED, or FAILED_TERMINAL when so configured.
func TestRawModelOutputIsReadable(t *testing.T) {
	t.Parallel()
	const said = "I'm sorry, the invoice is unreadable.\n{\"total\": "
	handlers := map[string]lease.Handler{
		"invalid": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.InvalidOutput(errors.New("no JSON in the answer"), json.RawMessage(said))
		}),
		"review": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
			return nil, jobs.NeedsReview(json.RawMessage(said), "the model hedged")
		}),
	}
	for name, policy := range map[string]lease.InvalidOutputPolicy{"review": lease.InvalidOutputReview, "fail": lease.InvalidOutputFail} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			cfg := fastConfig(handlers)
			cfg.InvalidOutput = policy
			f.start(cfg)
			invalid := f.enqueue(jobs.EnqueueParams{Kind: "invalid"})
			review := f.enqueue(jobs.EnqueueParams{Kind: "review"})

			j := f.await(invalid.ID)
			want := jobs.StateReviewRequired
			if policy == lease.InvalidOutputFail {
				want = jobs.StateFailedTerminal
			}
			require.Equal(t, want, j.State)
			require.Equal(t, jobs.ClassInvalidOutput, j.ErrorClass)
			require.Equal(t, lease.DefaultInvalidOutputRuns, j.Attempt, "retried within the budget, then decided")
			var text string
			require.NoError(t, json.Unmarshal(j.Result, &text))
			require.Equal(t, said, text)

			j = f.await(review.ID)
			require.Equal(t, jobs.StateReviewRequired, j.State)
			require.Equal(t, 1, j.Attempt)
			require.NoError(t, json.Unmarshal(j.Result, &text))
			require.Equal(t, said, text)
		})
	}
}

// A handler that ignores its context is given up AttemptTimeout plus
// HungGrace after it started: its lease is no longer renewed, another
// runner takes the job over once it expires, the late result is recorded
// as stale, and the hung goroutines keep their slots, so the runner never
// runs more than MaxWorkers handlers.
func TestHungHandlerIsTakenOver(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := telemetrytest.NewMetrics(t)
	const maxWorkers = 2
	release := make(chan struct{})
	var live, peak atomic.Int32
	var startedMu sync.Mutex
	started := map[string]time.Time{} // first attempt's start, by job id
	hanging := lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		n := live.Add(1)
		defer live.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		startedMu.Lock()
		started[job.ID.String()] = time.Now()
		startedMu.Unlock()
		<-release // an HTTP call without a deadline
		return json.RawMessage(`{"by":"hung"}`), nil
	})
	cfgA := lease.Config{
		Handlers:       map[string]lease.Handler{"k": hanging},
		Queues:         map[string]lease.QueueConfig{"default": {MaxWorkers: maxWorkers}},
		LeaseDuration:  2 * time.Second,
		AttemptTimeout: time.Second,
		PollInterval:   50 * time.Millisecond,
		ShutdownGrace:  time.Second,
		Retry:          llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond},
		MeterProvider:  m.Provider,
		WorkerID:       "A",
		Logger:         slog.New(slog.DiscardHandler),
	}
	const bound = time.Second + time.Second + 2*time.Second + 2*time.Second/6 // timeout + default grace + lease + reap interval
	_, stopA := f.start(cfgA)
	first := []*jobs.Job{f.enqueue(jobs.EnqueueParams{Kind: "k"}), f.enqueue(jobs.EnqueueParams{Kind: "k"})}
	require.Eventually(t, func() bool { return live.Load() == maxWorkers }, 5*time.Second, 5*time.Millisecond)
	more := []*jobs.Job{f.enqueue(jobs.EnqueueParams{Kind: "k"}), f.enqueue(jobs.EnqueueParams{Kind: "k"})}
	require.Eventually(t, func() bool {
		n, _ := m.Collect(t).Int("llmq.attempts.hung", attribute.String("queue", "default"), attribute.String("kind", "k"))
		return n == maxWorkers
	}, 2*bound, 10*time.Millisecond, "both attempts are given up as hung")

	var takenOver sync.Map // job id → when B started it
	cfgB := cfgA
	cfgB.WorkerID, cfgB.MeterProvider = "B", nil
	cfgB.Queues = map[string]lease.QueueConfig{"default": {MaxWorkers: 4}}
	cfgB.Handlers = map[string]lease.Handler{"k": lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		takenOver.LoadOrStore(job.ID.String(), time.Now())
		return json.RawMessage(`{"by":"B"}`), nil
	})}
	f.start(cfgB)
	for _, j := range append(first, more...) {
		done := f.await(j.ID)
		require.Equal(t, jobs.StateSucceeded, done.State)
		require.JSONEq(t, `{"by":"B"}`, string(done.Result))
		require.Equal(t, "B", done.LeaseOwner)
	}
	for _, j := range first {
		startedMu.Lock()
		hungSince := started[j.ID.String()]
		startedMu.Unlock()
		v, ok := takenOver.Load(j.ID.String())
		require.True(t, ok)
		at, ok := v.(time.Time)
		require.True(t, ok)
		// Claiming after the reaper freed it takes a sweep and a claim: a
		// poll interval, and slack for a loaded machine.
		require.Less(t, at.Sub(hungSince), bound+cfgA.PollInterval+time.Second)
		attempts := f.attempts(j.ID)
		require.Len(t, attempts, 2)
		require.Equal(t, jobs.AttemptHung, attempts[0].Outcome)
		require.True(t, attempts[0].Usage.Uncertain)
		require.Equal(t, jobs.AttemptSucceeded, attempts[1].Outcome)
	}
	require.LessOrEqual(t, peak.Load(), int32(maxWorkers), "hung handlers keep their slots")

	close(release) // the hung calls return at last
	require.NoError(t, stopA())
	for _, j := range first {
		a := f.attempts(j.ID)[0]
		require.Equal(t, jobs.AttemptStale, a.Outcome, "the late result is recorded stale")
		require.Contains(t, a.Error, "hung")
		done, err := f.store.Get(t.Context(), f.pool, "acme", j.ID)
		require.NoError(t, err)
		require.JSONEq(t, `{"by":"B"}`, string(done.Result), "the late result changed nothing")
	}
	require.Equal(t, int32(maxWorkers), peak.Load())
}

// Jobs of a kind no runner has a handler for do not wait unseen: the
// runners serving their queue warn about them, and say where the missing
// handler goes.
func TestUnservedKindsAreReported(t *testing.T) {
	t.Parallel()
	f := setup(t)
	logs := &telemetrytest.LogBuffer{}
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})})
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	cfg.UnservedKinds = 200 * time.Millisecond
	f.start(cfg)
	served := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	f.enqueue(jobs.EnqueueParams{Kind: "invoice.extract.v2"})
	f.enqueue(jobs.EnqueueParams{Kind: "invoice.extract.v2"})
	require.Equal(t, jobs.StateSucceeded, f.await(served.ID).State)
	require.Eventually(t, func() bool {
		for _, l := range jsonLines(logs) {
			msg, _ := l["msg"].(string)
			if l["level"] == "WARN" && l["kind"] == "invoice.extract.v2" && l["jobs"] == float64(2) &&
				strings.Contains(msg, "no handler") && strings.Contains(msg, "lease.Config.Handlers") {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond)
	for _, l := range jsonLines(logs) {
		require.NotEqual(t, "k", l["kind"], "a served kind is never reported: %v", l)
	}
}

// acquireCounter counts the pool's connections in use as the pool hands
// them out and takes them back (synchronously, unlike AfterRelease).
type acquireCounter struct{ inUse, peak *atomic.Int32 }

func (c *acquireCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *acquireCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *acquireCounter) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

func (c *acquireCounter) TraceAcquireEnd(_ context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err != nil {
		return
	}
	n := c.inUse.Add(1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
}
func (c *acquireCounter) TraceRelease(*pgxpool.Pool, pgxpool.TraceReleaseData) { c.inUse.Add(-1) }

// A runner uses at most three connections of its pool at once, whatever
// its number of workers: here 100 workers whose invalid answers each read
// the attempt history.
func TestRunnerConnectionsAreBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var inUse, peak atomic.Int32
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	pcfg.MaxConns = 20
	pcfg.ConnConfig.Tracer = &acquireCounter{inUse: &inUse, peak: &peak}
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	const n = 200
	params := make([]jobs.EnqueueParams, n)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k"}
	}
	res, err := f.store.EnqueueMany(t.Context(), f.pool, params)
	require.NoError(t, err)
	b := newBarrier(100)
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		b.wait(ctx)
		if job.Attempt == 1 {
			return nil, jobs.InvalidOutput(errors.New("bad"), json.RawMessage(`{}`))
		}
		return json.RawMessage(`{}`), nil
	})})
	cfg.ClaimBatch = 100
	cfg.Queues = map[string]lease.QueueConfig{"default": {MaxWorkers: 100}}
	r, err := lease.NewRunner(pool, f.store, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for _, j := range res {
		require.Equal(t, jobs.StateSucceeded, f.await(j.Job.ID).State)
	}
	cancel()
	require.NoError(t, <-done)
	require.LessOrEqual(t, peak.Load(), int32(3))
	require.Positive(t, peak.Load())
}

// Recording a hung attempt may wait (here on a row the test holds) for up
// to a third of the lease; a live lease is renewed before that wait, not
// after it. The live job is claimed during a wait, and must be renewed as
// soon as the next heartbeat starts, not after that heartbeat's wait.
func TestHeartbeatRenewsLiveLeasesBeforeMarkingHungOnes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	release := make(chan struct{})
	defer close(release)
	cfg := lease.Config{
		Handlers: map[string]lease.Handler{
			"hang": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
				<-release // ignores its context
				return nil, nil
			}),
			"live": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}),
		},
		Queues:            map[string]lease.QueueConfig{"default": {MaxWorkers: 2}},
		LeaseDuration:     6 * time.Second, // hung attempts are recorded within 2s
		HeartbeatInterval: 200 * time.Millisecond,
		AttemptTimeout:    3 * time.Second,
		HungGrace:         200 * time.Millisecond,
		PollInterval:      20 * time.Millisecond,
		ShutdownGrace:     100 * time.Millisecond,
		WorkerID:          "A",
		Logger:            slog.New(slog.DiscardHandler),
	}
	_, stop := f.start(cfg)
	defer func() { _ = stop() }()
	hung := f.enqueue(jobs.EnqueueParams{Kind: "hang"})
	require.Eventually(t, func() bool {
		j, err := f.store.Get(t.Context(), f.pool, "acme", hung.ID)
		require.NoError(t, err)
		return j.State == jobs.StateRunning
	}, 5*time.Second, 5*time.Millisecond)

	// The hung attempt's row, written first by a transaction left open:
	// MarkHung waits on it until its 2s timeout, at every heartbeat.
	blocker, err := f.pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.Background()) }()
	_, err = blocker.Exec(t.Context(), "INSERT INTO "+f.schema+".job_attempts (job_id, attempt, fence, worker, started_at, outcome) VALUES ($1, 1, 0, 'test', now(), 'hung')", hung.ID)
	require.NoError(t, err)
	var blockerPID int
	require.NoError(t, blocker.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&blockerPID))
	var waitStart time.Time
	require.Eventually(t, func() bool {
		err := f.pool.QueryRow(t.Context(), "SELECT query_start FROM pg_stat_activity "+
			"WHERE $1::int = ANY (pg_blocking_pids(pid))", blockerPID).Scan(&waitStart)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	}, 10*time.Second, 5*time.Millisecond, "MarkHung never waited on the row")
	// Claimed during the wait, after this heartbeat renewed its leases:
	// the next heartbeat, right after the wait ends, must renew it first.
	live := f.enqueue(jobs.EnqueueParams{Kind: "live"})
	var claimed, renewed *jobs.Job
	require.Eventually(t, func() bool {
		j, err := f.store.Get(t.Context(), f.pool, "acme", live.ID)
		require.NoError(t, err)
		if j.State != jobs.StateRunning {
			return false
		}
		if claimed == nil {
			claimed = j
		}
		renewed = j
		return j.LeaseUntil.After(claimed.LeaseUntil)
	}, 10*time.Second, 5*time.Millisecond, "the live lease was never renewed")
	waitEnd := waitStart.Add(cfg.LeaseDuration / 3) // MarkHung's timeout
	require.True(t, claimed.AttemptedAt.Before(waitEnd), "the live job was claimed during the wait")
	delay := renewed.LeaseUntil.Add(-cfg.LeaseDuration).Sub(waitEnd)
	// Renewed within a heartbeat or so of the wait's end (measured: about
	// 0), not after another wait (measured: 1.3-2s).
	require.Less(t, delay, 3*cfg.HeartbeatInterval, "the live lease waited for the hung attempt's recording a second time")
}
