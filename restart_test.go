package llmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/pgcluster"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/outbox"
)

// restartLease is the runners' lease in TestDatabaseRestartsUnderLoad:
// longer than the 6s stop, which is longer than the few quick retries a
// runner once gave an outcome (about 1.6s).
const restartLease = 30 * time.Second

// A PostgreSQL cluster of the test's own restarts under load: jobs are
// enqueued at up to 200 a second, two runners run them (each handler call
// counted per job) and a relay publishes their events to a broker.
//
//   - A 3s restart, begun while the relay is publishing a batch it
//     claimed: publication resumes within 2s of the database being back,
//     and every event written before it is published soon after (not a
//     ClaimLease of 30s later).
//   - A 6s stop, while handlers are running and return meanwhile: no
//     handler runs twice, and every job succeeds; none fails because of
//     the outage.
func TestDatabaseRestartsUnderLoad(t *testing.T) {
	t.Parallel()
	cluster := pgcluster.New(t)
	db := dbtest.Setup(t, dbtest.Options{URL: cluster.URL(), MaxConns: 8})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	events, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	defer running.Wait()
	defer cancel()

	calls := &handlerCalls{byJob: map[uuid.UUID]int{}}
	for i := range 2 {
		r, err := lease.NewRunner(ownPool(t, cluster.URL()), store, lease.Config{
			Handlers: map[string]lease.Handler{"restart.work": calls.handler()},
			Queues:   map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 50}},
			WorkerID: fmt.Sprintf("runner-%d", i), LeaseDuration: restartLease, AttemptTimeout: 20 * time.Second,
			Logger: slog.New(slog.DiscardHandler),
		})
		require.NoError(t, err)
		running.Go(func() {
			if err := r.Run(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	pub := &watchedPublisher{Publisher: memory.New(memory.Config{}).Publisher(), stopped: make(chan error, 1)}
	relay, err := events.NewRelay(ownPool(t, cluster.URL()), pub, outbox.RelayConfig{ID: "relay", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	running.Go(func() {
		if err := relay.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	load, stopLoad := context.WithCancel(ctx)
	var enqueued atomic.Int64
	for range enqueuers {
		running.Go(func() { enqueueSteadily(load, store, db.Pool, &enqueued) })
	}
	require.Eventually(t, func() bool { return calls.total() > 200 && relay.Active() }, 30*time.Second, 10*time.Millisecond, "load runs")

	// The restart begins inside a publication, once the broker confirmed
	// it: the relay's verdict on that batch is what the stop fails.
	pub.stopDuring(cluster.Stop)
	require.NoError(t, <-pub.stopped)
	time.Sleep(3 * time.Second) // the restart's down time
	require.NoError(t, cluster.Start(t.Context()))
	back := time.Now()
	require.Eventually(t, func() bool { return pub.lastPublished().After(back) }, 2*time.Second, time.Millisecond,
		"publication resumes within 2s of the database being back")
	resumed := pub.lastPublished().Sub(back)
	db.Pool.Reset() // the test's own connections from before the restart
	written := writtenUpTo(t, db)
	require.Eventually(t, func() bool { return unpublishedUpTo(t, db, written) == 0 }, 15*time.Second, 10*time.Millisecond,
		"the events written before the restart are published, well within the claim lease")
	caughtUp := time.Since(back)

	// The stop: handlers running now return while the database is down.
	require.Eventually(t, func() bool { return calls.running.Load() >= 10 }, 30*time.Second, time.Millisecond, "handlers run")
	before := calls.total()
	calls.outage.Store(true)
	require.NoError(t, cluster.Stop(t.Context()))
	time.Sleep(6 * time.Second) // the outage
	require.NoError(t, cluster.Start(t.Context()))
	calls.outage.Store(false)
	db.Pool.Reset()
	require.Eventually(t, func() bool { return calls.total() > before+200 }, 30*time.Second, 10*time.Millisecond, "load resumes")
	stopLoad()

	require.Eventually(t, func() bool { return unfinished(t, db) == 0 }, 2*restartLease+30*time.Second, 50*time.Millisecond,
		"every job finishes")
	for id, n := range calls.snapshot() {
		require.Equal(t, 1, n, "job %s: its handler ran once", id)
	}
	var notSucceeded, failedAttempts int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+db.Schema+".jobs WHERE state <> 'SUCCEEDED'").Scan(&notSucceeded))
	require.NoError(t, db.Pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+db.Schema+".job_attempts WHERE outcome NOT IN ('succeeded', 'released', 'snoozed')").Scan(&failedAttempts))
	require.Zero(t, notSucceeded, "no job failed because of the outage")
	require.Zero(t, failedAttempts, "no attempt failed because of the outage")
	require.Positive(t, calls.returnedInOutage.Load(), "outcomes were in hand while the database was down")
	require.Eventually(t, func() bool { return unpublishedUpTo(t, db, writtenUpTo(t, db)) == 0 }, 30*time.Second, 50*time.Millisecond,
		"every event is published")
	t.Logf("3s restart: publication resumed %s after the database was back, and the events written before it were published within %s; "+
		"6s stop: %d outcomes were in hand while the database was down; %d jobs enqueued, %d handler calls",
		resumed.Round(time.Millisecond), caughtUp.Round(time.Millisecond), calls.returnedInOutage.Load(), enqueued.Load(), calls.total())
}

// ownPool is a pool of its own on url, closed when the test ends.
func ownPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// handlerCalls counts handler calls by job, and those that returned while
// the database was down.
type handlerCalls struct {
	mu               sync.Mutex
	byJob            map[uuid.UUID]int
	running          atomic.Int64
	outage           atomic.Bool
	returnedInOutage atomic.Int64
}

// handler takes 50 to 150ms, as a short model call would.
func (c *handlerCalls) handler() lease.Handler {
	return lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		c.mu.Lock()
		c.byJob[job.ID]++
		n := len(c.byJob)
		c.mu.Unlock()
		c.running.Add(1)
		defer c.running.Add(-1)
		select {
		case <-time.After(time.Duration(50+n%100) * time.Millisecond):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		if c.outage.Load() {
			c.returnedInOutage.Add(1)
		}
		return json.RawMessage(`{"ok":true}`), nil
	})
}

func (c *handlerCalls) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, calls := range c.byJob {
		n += calls
	}
	return n
}

func (c *handlerCalls) snapshot() map[uuid.UUID]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uuid.UUID]int, len(c.byJob))
	for id, n := range c.byJob {
		out[id] = n
	}
	return out
}

// enqueuers enqueue a job every 20ms each: 200 jobs a second together.
const enqueuers = 4

// enqueueSteadily enqueues a job every 20ms until ctx ends; an enqueue the
// database fails (it is down) is not tried again.
func enqueueSteadily(ctx context.Context, store *jobs.PostgresStore, pool *pgxpool.Pool, enqueued *atomic.Int64) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		enqueueCtx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := store.Enqueue(enqueueCtx, pool, jobs.EnqueueParams{Tenant: "acme", Kind: "restart.work", Payload: json.RawMessage(`{}`)})
		cancel()
		if err == nil {
			enqueued.Add(1)
		}
	}
}

// watchedPublisher publishes to the broker and notes when its last
// confirmed publication returned; stopDuring has the next one, once the
// broker confirmed it, stop the database before it returns.
type watchedPublisher struct {
	broker.Publisher
	last    atomic.Int64 // unix nanoseconds
	mu      sync.Mutex
	stop    func(context.Context) error
	stopped chan error
}

func (p *watchedPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	if err := p.Publisher.Publish(ctx, msgs); err != nil {
		return err
	}
	p.mu.Lock()
	stop := p.stop
	p.stop = nil
	p.mu.Unlock()
	if stop != nil {
		p.stopped <- stop(context.WithoutCancel(ctx))
	}
	p.last.Store(time.Now().UnixNano())
	return nil
}

func (p *watchedPublisher) stopDuring(stop func(context.Context) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stop = stop
}

func (p *watchedPublisher) lastPublished() time.Time { return time.Unix(0, p.last.Load()) }

// writtenUpTo is the highest seq of the events written so far.
func writtenUpTo(t *testing.T, db *dbtest.DB) int64 {
	t.Helper()
	var seq int64
	require.NoError(t, db.Pool.QueryRow(t.Context(), fmt.Sprintf(
		"SELECT greatest((SELECT coalesce(max(seq), 0) FROM %[1]s.outbox), (SELECT coalesce(max(last_seq), 0) FROM %[1]s.outbox_batches))",
		db.Schema)).Scan(&seq))
	return seq
}

// unpublishedUpTo counts the unpublished events (and batch rows) with a
// seq up to seq.
func unpublishedUpTo(t *testing.T, db *dbtest.DB, seq int64) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), fmt.Sprintf(
		"SELECT (SELECT count(*) FROM %[1]s.outbox WHERE published_at IS NULL AND seq <= $1) + "+
			"(SELECT count(*) FROM %[1]s.outbox_batches WHERE published_at IS NULL AND first_seq <= $1)", db.Schema), seq).Scan(&n))
	return n
}

// unfinished counts the jobs not yet in a terminal state.
func unfinished(t *testing.T, db *dbtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+db.Schema+".jobs WHERE state NOT IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')").Scan(&n))
	return n
}
