package lease_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/pgcluster"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// A prepared statement pgx's cache holds is gone from the server session
// when the completion runs (SQLSTATE 26000), as behind PgBouncer in
// transaction mode when the next transaction lands on another server
// connection: the outcome is recorded on the next try, and the job
// succeeds on its first attempt, instead of failing as unrecordable.
// (TestConnectionErrorsAreNotRefusals covers the errors one by one; here
// pgx's own retry state is exercised through the runner.)
func TestPoolerStatementErrorIsNotTheJobsFault(t *testing.T) {
	t.Parallel()
	f := setup(t)
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 1 // one session, whose statement cache every statement of the runner uses
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	var calls atomic.Int32
	started, proceed := make(chan struct{}, 1), make(chan struct{})
	rcfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		if calls.Add(1) > 1 {
			started <- struct{}{}
			<-proceed
		}
		return json.RawMessage(`{"ok":true}`), nil
	})})
	rcfg.Logger = slog.New(slog.DiscardHandler)
	r, err := lease.NewRunner(pool, f.store, rcfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	// The first job's completion puts the completion statement in the
	// session's cache.
	require.Equal(t, jobs.StateSucceeded, f.await(f.enqueue(jobs.EnqueueParams{Kind: "k"}).ID).State)
	job := f.enqueue(jobs.EnqueueParams{Kind: "k"})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the second job did not start")
	}
	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	_, err = conn.Conn().PgConn().Exec(t.Context(), "DEALLOCATE ALL").ReadAll() // behind the cache's back
	conn.Release()
	require.NoError(t, err)
	close(proceed)

	j := f.await(job.ID)
	require.Equal(t, jobs.StateSucceeded, j.State, "%s: %s", j.ErrorClass, j.LastError)
	require.Equal(t, 1, j.Attempt)
	require.EqualValues(t, 2, calls.Load(), "no handler ran twice")
}

// The server ends the session of the completion's transaction while the
// host's OnSucceeded hook runs in it (a failover, pg_terminate_backend),
// four times in a row: that is the database's trouble, not the hook's, so
// the outcome is tried again, with its hook, until it is recorded; the
// job succeeds on its first attempt and its handler ran once. (Counted as
// the hook's failures, three of them recorded the success as a transient
// failure, and the handler ran again.)
func TestOnSucceededOnAnEndedSessionIsTriedAgain(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var calls, hooks atomic.Int32
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		calls.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})})
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		if hooks.Add(1) <= 4 {
			_, err := tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
			return err
		}
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}
	f.start(cfg)
	j := f.await(f.enqueue(jobs.EnqueueParams{Kind: "k"}).ID)
	require.Equal(t, jobs.StateSucceeded, j.State, "%s: %s", j.ErrorClass, j.LastError)
	require.Equal(t, 1, j.Attempt)
	require.EqualValues(t, 1, calls.Load(), "the handler ran once")
	require.EqualValues(t, 5, hooks.Load())
}

// The database stops while a handler's outcome is in hand and stays down
// for 4s, longer than a few quick retries and shorter than the lease: the
// outcome is recorded once the database is back, so the job succeeds on
// its first attempt and its handler ran once. (Given up after a few
// tries, the outcome was lost: the job waited out its lease and ran
// again.)
func TestOutcomeWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	cluster := pgcluster.New(t)
	db := dbtest.Setup(t, dbtest.Options{URL: cluster.URL(), MaxConns: 6})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)

	var calls atomic.Int32
	returned := make(chan struct{})
	proceed := make(chan struct{})
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			<-proceed
			defer close(returned)
		}
		return json.RawMessage(`{"ok":true}`), nil
	})})
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.AttemptTimeout = 15*time.Second, time.Second, 10*time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := lease.NewRunner(db.Pool, store, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	res, err := store.Enqueue(t.Context(), db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, cluster.Stop(t.Context()))
	close(proceed)
	<-returned
	time.Sleep(4 * time.Second) // the outage: the outcome is in hand meanwhile
	require.NoError(t, cluster.Start(t.Context()))

	var job *jobs.Job
	require.Eventually(t, func() bool {
		job, err = store.Get(t.Context(), db.Pool, "acme", res.Job.ID)
		return err == nil && job.State.Terminal()
	}, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, jobs.StateSucceeded, job.State, "%s: %s", job.ErrorClass, job.LastError)
	require.Equal(t, 1, job.Attempt)
	require.EqualValues(t, 1, calls.Load(), "the handler ran once")
}

// The database stops just as a durable step's function returns, and stays
// down for 3s, longer than a few quick retries: the step's output is
// stored once the database is back, the job succeeds on its first attempt,
// and neither the step nor the handler ran twice. (Given up after a few
// tries, the attempt failed and the retry paid for the step again.)
func TestStepOutputWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	cluster := pgcluster.New(t)
	db := dbtest.Setup(t, dbtest.Options{URL: cluster.URL(), MaxConns: 6})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)

	var calls, steps atomic.Int32
	stopped := make(chan error, 1)
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		calls.Add(1)
		text, err := lease.Step(ctx, "ocr", func(ctx context.Context) (string, error) {
			if steps.Add(1) == 1 {
				stopped <- cluster.Stop(ctx)
			}
			return "total 1234.50", nil
		})
		if err != nil {
			return nil, err
		}
		return json.Marshal(text)
	})})
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.AttemptTimeout = 15*time.Second, time.Second, 10*time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := lease.NewRunner(db.Pool, store, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	res, err := store.Enqueue(t.Context(), db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.NoError(t, <-stopped)
	time.Sleep(3 * time.Second) // the outage: the step's output is in hand meanwhile
	require.NoError(t, cluster.Start(t.Context()))

	var job *jobs.Job
	require.Eventually(t, func() bool {
		job, err = store.Get(t.Context(), db.Pool, "acme", res.Job.ID)
		return err == nil && job.State.Terminal()
	}, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, jobs.StateSucceeded, job.State, "%s: %s", job.ErrorClass, job.LastError)
	require.Equal(t, 1, job.Attempt)
	require.EqualValues(t, 1, steps.Load(), "the step ran once")
	require.EqualValues(t, 1, calls.Load(), "the handler ran once")
}
