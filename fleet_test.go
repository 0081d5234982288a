package llmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/outbox"
)

// One process of a fleet runs a runner with 100 workers, the active relay,
// an ingress and a Postgres limiter at their defaults. Each component
// bounds what it takes from its pool, whatever its concurrency (runner 3,
// relay 2, ingress 1, limiter 1 per hot provider pool and 4 at most), and
// the runner and the relay each hold one LISTEN connection beside it.
// docs/operations.md ("Database connections") recommends one pool of 4 connections for
// all of them: with LISTEN, the process then holds 6.
const (
	recommendedProcessPool  = 4
	processConnectionBudget = recommendedProcessPool + 2
	// naturalProcessPeak bounds what the busy process opens when its pool
	// would let it open 40: the components' own bounds at one hot pool
	// (3 + 2 + 1 + 1) and the two LISTEN connections.
	naturalProcessPeak = 3 + 2 + 1 + 1 + 2
)

// The process, busy with 2,000 jobs whose handlers hold admission permits
// and whose events the relay publishes and the ingress takes into the
// inbox, never opens more connections than its components' bounds allow,
// however many workers it runs: on a pool that could open 40 it stays
// within naturalProcessPeak, and on the recommended pool of 4 within
// processConnectionBudget, doing the same work. (A pool opens a connection
// only when every open one is busy, so the server's count of the process's
// connections is the peak of its concurrent use.) The load comes from the
// host's own pool, which is not counted.
func TestProcessStaysWithinItsConnectionBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		poolSize int32
		budget   int
	}{
		{"pool of 40", 40, naturalProcessPeak},
		{"recommended pool", recommendedProcessPool, processConnectionBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runBusyProcess(t, c.poolSize, c.budget)
		})
	}
}

// runBusyProcess runs the process on a pool of poolSize and requires that
// it opened at most budget connections.
func runBusyProcess(t *testing.T, poolSize int32, budget int) {
	t.Helper()
	const (
		jobCount = 2000
		kind     = "budget.work"
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 12})
	app := "llmq_budget_" + db.Schema
	pool := processPool(t, app, poolSize)

	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	limiter, err := admission.NewPostgres(pool, admission.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, limiter.SetPool(ctx, admission.Pool{Name: "provider", RPM: 10_000_000, TPM: 1_000_000_000, MaxInFlight: 100}))
	var calls atomic.Int64
	work := lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		calls.Add(1)
		select { // a provider call of a few milliseconds, honouring the lease
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		lease.Responded(ctx, 200, nil)
		lease.RecordUsage(ctx, jobs.Usage{InputTokens: 80, OutputTokens: 20})
		return json.RawMessage(`{"ok":true}`), nil
	})
	runner, err := lease.NewRunner(pool, store, lease.Config{
		Handlers: map[string]lease.Handler{kind: work},
		Queues:   map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 100}},
		Admission: &lease.Admission{Limiter: limiter, Route: func(job *jobs.Job) (admission.Request, bool) {
			return admission.Request{Pool: "provider", Tenant: job.Tenant, Tokens: 100}, true
		}},
	})
	require.NoError(t, err)

	events, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	bus := memory.New(memory.Config{})
	t.Cleanup(func() { require.NoError(t, bus.Close()) })
	relay, err := events.NewRelay(pool, bus.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	received, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	ingress, err := received.NewIngress(pool, bus.Consumer(jobs.DefaultEventTopic), inbox.IngressConfig{
		Consumer: "budget",
		Handler:  func(context.Context, pgx.Tx, broker.Message) error { return nil },
	})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for name, run := range map[string]func(context.Context) error{"runner": runner.Run, "relay": relay.Run, "ingress": ingress.Run} {
		wg.Go(func() {
			if err := run(runCtx); err != nil && runCtx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	peak := watchConnections(runCtx, t, db.Pool, app, pool)

	began := time.Now()
	enqueueConcurrently(ctx, t, db.Pool, store, kind, jobCount, 8)
	// Done when every job succeeded and both of its events (requested,
	// succeeded) reached the inbox through the relay and the ingress.
	require.Eventually(t, func() bool {
		var succeeded, accepted int
		require.NoError(t, db.Pool.QueryRow(ctx, fmt.Sprintf(
			`SELECT (SELECT count(*) FROM %[1]s.jobs WHERE state = 'SUCCEEDED'), (SELECT count(*) FROM %[1]s.inbox)`,
			db.Schema)).Scan(&succeeded, &accepted))
		return succeeded == jobCount && accepted == 2*jobCount
	}, 90*time.Second, 20*time.Millisecond, "jobs and their events never all came through")
	stop()
	wg.Wait()

	took := time.Since(began)
	seen, acquired := peak()
	t.Logf("pool of %d: %d jobs and their events in %s; peak connections of the process: %d open (pg_stat_activity), %d acquired from its pool at once",
		poolSize, jobCount, took.Round(time.Millisecond), seen, acquired)
	require.Equal(t, int64(jobCount), calls.Load(), "every job ran once")
	require.LessOrEqual(t, seen, budget, "connections the process opened")
}

// processPool is the pool of the process under test: its connections, and
// those opened from its configuration (LISTEN), carry app as their
// application_name.
func processPool(t *testing.T, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// watchConnections samples, until ctx ends, how many connections the
// server has open for app and how many of pool's are acquired at once; the
// returned function reports both peaks once ctx has ended.
func watchConnections(ctx context.Context, t *testing.T, observer *pgxpool.Pool, app string, pool *pgxpool.Pool) func() (open int, acquired int32) {
	t.Helper()
	var peakOpen int
	var peakAcquired int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			peakAcquired = max(peakAcquired, pool.Stat().AcquiredConns())
			var n int
			err := observer.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
			if err == nil {
				peakOpen = max(peakOpen, n)
			}
		}
	}()
	return func() (int, int32) {
		<-done
		return peakOpen, peakAcquired
	}
}

// enqueueConcurrently accepts n jobs of kind from producers goroutines, one
// job per transaction, as request handlers of a service would.
func enqueueConcurrently(ctx context.Context, t *testing.T, pool *pgxpool.Pool, store *jobs.PostgresStore, kind string, n, producers int) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				_, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{
					Tenant: fmt.Sprintf("tenant-%d", i%10), Kind: kind, IdempotencyKey: fmt.Sprintf("job-%d", i),
				})
				if err != nil {
					t.Errorf("enqueue %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
