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

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/pgbouncertest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/retention"
)

// The query exec modes of pgx that send each statement whole, in one
// round trip, so that no prepared statement has to outlive a transaction:
// the modes PgBouncer before 1.21 in transaction pooling mode leaves a host
// (docs/operations.md, Connection poolers). describe_exec is not one: it
// describes a statement in one round trip and binds it in another, which
// the pooler may send to another server connection.
var poolerModes = []string{"exec", "simple_protocol", "cache_describe"}

// A process wired as operators deploy it behind PgBouncer in transaction
// pooling mode (every component on a pool through the pooler, LISTEN off)
// migrates its schema, accepts jobs one by one, idempotently and as a
// batch, runs them under admission with a durable step, relays their
// events to a broker, takes them into the inbox and prunes, in each of
// pgx's exec modes: every job runs once and succeeds, every event arrives
// once, no permit stays held and nothing is logged as a failure.
func TestCorePathsBehindPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range poolerModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			runBehindPooler(t, mode)
		})
	}
}

func runBehindPooler(t *testing.T, mode string) {
	t.Helper()
	const (
		kind     = "pooled.work"
		single   = 120
		inBatch  = 80
		jobCount = single + inBatch
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The schema is reserved (and dropped) on a direct connection, which
	// also observes; everything under test goes through the pooler.
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	bouncer := pgbouncertest.Start(t)
	pool := pooledPool(t, bouncer.URL(mode))
	for range 2 { // idempotent, as every replica migrates at start-up
		_, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: db.Schema})
		require.NoError(t, err)
	}

	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	limiter, err := admission.NewPostgres(pool, admission.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, limiter.SetPool(ctx, admission.Pool{Name: "provider", RPM: 1_000_000, TPM: 100_000_000, MaxInFlight: 8}))
	calls := &callCounter{byJob: map[string]int{}}
	work := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		answer, err := lease.Step(ctx, "call", func(ctx context.Context) (string, error) {
			calls.add(job.ID.String())
			lease.Responded(ctx, 200, nil)
			lease.RecordUsage(ctx, jobs.Usage{InputTokens: 80, OutputTokens: 20})
			return "answer for " + job.ID.String(), nil
		})
		if err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"answer": answer})
	})
	var failures atomic.Int64
	runner, err := lease.NewRunner(pool, store, lease.Config{
		Handlers:      map[string]lease.Handler{kind: work},
		Queues:        map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 16}},
		DisableListen: true,
		PollInterval:  20 * time.Millisecond,
		Admission: &lease.Admission{Limiter: limiter, Route: func(job *jobs.Job) (admission.Request, bool) {
			return admission.Request{Pool: "provider", Tenant: job.Tenant, Tokens: 100}, true
		}},
		AfterRecord: func(_ *jobs.Job, err error) {
			if err != nil {
				failures.Add(1)
			}
		},
	})
	require.NoError(t, err)

	events, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	bus := memory.New(memory.Config{})
	t.Cleanup(func() { require.NoError(t, bus.Close()) })
	relay, err := events.NewRelay(pool, bus.Publisher(), outbox.RelayConfig{DisableListen: true, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	received, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	ingress, err := received.NewIngress(pool, bus.Consumer(jobs.DefaultEventTopic), inbox.IngressConfig{
		Consumer: "pooled",
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
	defer func() { stop(); wg.Wait() }()

	enqueueConcurrently(ctx, t, pool, store, kind, single, 8)
	again, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "tenant-1", Kind: kind, IdempotencyKey: "job-1"})
	require.NoError(t, err)
	require.True(t, again.Existing, "the same key finds the job it accepted")
	batch := jobs.EnqueueBatchParams{Tenant: "tenant-batch", Key: "upload-1"}
	for i := range inBatch {
		batch.Jobs = append(batch.Jobs, jobs.EnqueueParams{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"doc":%d}`, i))})
	}
	accepted, err := store.EnqueueBatch(ctx, pool, batch)
	require.NoError(t, err)
	require.Len(t, accepted.Jobs, inBatch)

	// Each job's requested and succeeded events, and the batch's
	// completion, through the relay and the ingress into the inbox.
	wantEvents := 2*jobCount + 1
	var succeeded, relayed int
	require.Eventually(t, func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx, fmt.Sprintf(
			`SELECT (SELECT count(*) FROM %[1]s.jobs WHERE state = 'SUCCEEDED'), (SELECT count(*) FROM %[1]s.inbox)`,
			db.Schema)).Scan(&succeeded, &relayed))
		return succeeded == jobCount && relayed == wantEvents
	}, 90*time.Second, 20*time.Millisecond, "jobs and their events never all came through")

	pass, err := pruneOnce(ctx, pool, db.Schema)
	require.NoError(t, err, "a retention pass through the pooler")
	require.Positive(t, pass.Batches)
	stop()
	wg.Wait()

	require.Equal(t, jobCount, calls.jobs(), "every job called the provider")
	require.Equal(t, 1, calls.most(), "no job called it twice")
	require.Zero(t, failures.Load(), "no outcome failed to be recorded")
	var attempts, unpublished int
	require.NoError(t, db.Pool.QueryRow(ctx, fmt.Sprintf(
		`SELECT (SELECT count(*) FROM %[1]s.job_attempts WHERE outcome = 'succeeded'),
		        (SELECT count(*) FROM %[1]s.outbox WHERE published_at IS NULL)`, db.Schema)).Scan(&attempts, &unpublished))
	require.Equal(t, jobCount, attempts, "one attempt per job, and it succeeded")
	require.Zero(t, unpublished)
	state, err := limiter.State(ctx, "provider")
	require.NoError(t, err)
	require.Zero(t, state.InFlight, "every permit was released")
	usage, err := limiter.Usage(ctx, "tenant-batch", time.Now(), time.Now())
	require.NoError(t, err)
	require.NotEmpty(t, usage, "the ledger counts the batch tenant's calls")
}

// pooledPool is a pool through the pooler at url.
func pooledPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// pruneOnce runs one retention pass, with the default policy, on pool.
func pruneOnce(ctx context.Context, pool *pgxpool.Pool, schema string) (retention.Pass, error) {
	svc, err := retention.New(pool, retention.Config{Schema: schema})
	if err != nil {
		return retention.Pass{}, err
	}
	return svc.PruneOnce(ctx)
}

// callCounter counts provider calls per job.
type callCounter struct {
	mu    sync.Mutex
	byJob map[string]int
}

func (c *callCounter) add(job string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byJob[job]++
}

func (c *callCounter) jobs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byJob)
}

func (c *callCounter) most() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	most := 0
	for _, n := range c.byJob {
		most = max(most, n)
	}
	return most
}

// pgx's default query exec mode caches prepared statements per client
// connection, which PgBouncer before 1.21 in transaction pooling mode
// cannot keep: the first call that meets another client's statement on
// the server connection (here the pooler has one) says the fix instead of
// PostgreSQL's bare "prepared statement already exists".
func TestDefaultModeBehindAnOldPoolerSaysTheFix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := dbtest.Setup(t)
	bouncer := pgbouncertest.Start(t, pgbouncertest.Options{PoolSize: 1})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	enqueue := func(pool *pgxpool.Pool, key string) error {
		_, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "t", Kind: "k", IdempotencyKey: key})
		return err
	}
	first, second := pooledPool(t, bouncer.URL("")), pooledPool(t, bouncer.URL(""))
	require.NoError(t, enqueue(first, "a"), "the first client prepares the statement on the one server connection")
	err = enqueue(second, "b")
	require.ErrorIs(t, err, llmqtype.ErrStatementCache)
	require.ErrorContains(t, err, "default_query_exec_mode=exec")
	require.ErrorContains(t, err, "SQLSTATE 42P05")
}
