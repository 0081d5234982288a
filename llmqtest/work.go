package llmqtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// Test defaults WorkUntilIdle applies to a zero lease.Config field.
const (
	TestRetryBase    = time.Millisecond
	TestRetryCap     = 20 * time.Millisecond
	TestPollInterval = 10 * time.Millisecond
	// IdleTimeout bounds WorkUntilIdle when ctx has no earlier deadline.
	IdleTimeout = 30 * time.Second
)

// WorkUntilIdle runs a lease.Runner with cfg on the test's schema until
// its queues are idle: no job RUNNING and no job of a kind cfg.Handlers
// serves eligible now or within the retry backoff's cap (so a handler that
// fails once is retried before it returns). Jobs of other kinds and jobs
// scheduled later stay as they are; the kinds of those without a handler
// are logged (t.Logf), since a misspelt kind ends up there. Zero Retry and PollInterval get test
// values (backoff of 1–20 ms, polls every 10 ms) instead of the runner's
// production defaults. The runner is stopped before WorkUntilIdle returns;
// a runner error, or queues still busy after IdleTimeout, fail the test.
func WorkUntilIdle(ctx context.Context, t testing.TB, db *DB, store jobs.RunnerStore, cfg lease.Config) {
	t.Helper()
	if cfg.Retry == (llmqtype.BackoffPolicy{}) {
		cfg.Retry = llmqtype.BackoffPolicy{Base: TestRetryBase, Cap: TestRetryCap}
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = TestPollInterval
	}
	queues := slices.Sorted(maps.Keys(cfg.Queues))
	if len(queues) == 0 {
		queues = []string{lease.DefaultQueue}
	}
	kinds := slices.Sorted(maps.Keys(cfg.Handlers))
	horizon := max(cfg.Retry.Cap, TestRetryCap)

	runner, err := lease.NewRunner(db.Pool, store, cfg)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	schema, err := dbsql.NewSchema(db.Schema)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	var q statements
	if _, err := q.load(schema); err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("llmqtest: runner: %v", err)
		}
	}()

	waitCtx, cancel := context.WithTimeout(ctx, IdleTimeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var idle bool
		err := db.Pool.QueryRow(waitCtx, q.idle, queues, kinds, horizon.String()).Scan(&idle)
		switch {
		case err != nil && waitCtx.Err() != nil:
			t.Fatalf("llmqtest: queues %v still busy after %s", queues, IdleTimeout)
		case err != nil:
			t.Fatalf("llmqtest: reading whether queues are idle: %v", err)
		case idle:
			logUnserved(waitCtx, t, db, q.unservedKinds, queues, kinds)
			return
		}
		select {
		case <-waitCtx.Done():
			t.Fatalf("llmqtest: queues %v still busy after %s", queues, IdleTimeout)
		case err := <-done:
			done <- err // for the deferred stop
			t.Fatalf("llmqtest: runner stopped before the queues were idle: %v", err)
		case <-tick.C:
		}
	}
}

// logUnserved says which waiting jobs the runner had no handler for, so a
// misspelt kind shows in the test's log instead of as a job that never ran.
func logUnserved(ctx context.Context, t testing.TB, db *DB, query string, queues, kinds []string) {
	t.Helper()
	rows, err := db.Pool.Query(ctx, query, queues, kinds)
	if err != nil {
		t.Logf("llmqtest: reading unserved kinds: %v", err)
		return
	}
	unserved, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Logf("llmqtest: reading unserved kinds: %v", err)
		return
	}
	if len(unserved) > 0 {
		t.Logf("llmqtest: jobs of kinds %q wait in queues %v with no handler in this runner (it has %q): a misspelt kind?", unserved, queues, kinds)
	}
}

// Inline runs fn as kind's handler on args, in this goroutine, through the
// same adapter as lease.Handle: args are encoded into a payload and decoded
// again, and the result is encoded and decoded, so a type that does not
// survive JSON fails here as it would in the runner. The job it sees is
// attempt 1 of tenant "test". For the handler's own logic; WorkUntilIdle
// runs it as the runner does.
func Inline[A, R any](ctx context.Context, t testing.TB, kind jobs.Kind[A, R],
	fn func(ctx context.Context, job *jobs.Job, args A) (R, error), args A) (R, error) {
	t.Helper()
	params, err := kind.Params("test", args, jobs.EnqueueOptions{})
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	job := &jobs.Job{ID: uuid.New(), Tenant: "test", Kind: kind.Name(), Queue: jobs.DefaultQueue,
		Payload: params.Payload, State: jobs.StateRunning, Attempt: 1, MaxAttempts: jobs.DefaultMaxAttempts}
	return InlineJob(ctx, t, kind, fn, job)
}

// InlineJob is Inline on a given job (one read back from the store, say,
// or one with a malformed payload).
func InlineJob[A, R any](ctx context.Context, t testing.TB, kind jobs.Kind[A, R],
	fn func(ctx context.Context, job *jobs.Job, args A) (R, error), job *jobs.Job) (R, error) {
	t.Helper()
	var zero R
	raw, err := lease.Handle(kind, fn).Handler.Work(ctx, job)
	if err != nil {
		return zero, err
	}
	r, err := kind.Result(&jobs.Job{ID: job.ID, Result: raw})
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return r, nil
}

// RequireEnqueued returns the newest job of kind for tenant visible on db
// (pass the transaction under test to see what it enqueued before it
// commits), with its decoded arguments. It fails the test when there is
// none, listing the kinds the tenant does have, or when the payload does
// not decode.
func RequireEnqueued[A, R any](ctx context.Context, t testing.TB, db jobs.DBTX, store jobs.Store, tenant string, kind jobs.Kind[A, R]) (*jobs.Job, A) {
	t.Helper()
	var zero A
	page, err := store.List(ctx, db, jobs.ListParams{Tenant: tenant, Kind: kind.Name(), Limit: 1})
	if err != nil {
		t.Fatalf("llmqtest: listing jobs: %v", err)
		return nil, zero
	}
	if len(page.Jobs) == 0 {
		t.Fatalf("llmqtest: no job of kind %q enqueued for tenant %q; its jobs have kinds %v", kind.Name(), tenant, tenantKinds(ctx, db, store, tenant))
		return nil, zero
	}
	job := page.Jobs[0]
	args, err := kind.Args(job)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return job, args
}

// RequireNotEnqueued fails the test when db shows a job of kind for
// tenant.
func RequireNotEnqueued[A, R any](ctx context.Context, t testing.TB, db jobs.DBTX, store jobs.Store, tenant string, kind jobs.Kind[A, R]) {
	t.Helper()
	page, err := store.List(ctx, db, jobs.ListParams{Tenant: tenant, Kind: kind.Name(), Limit: 1})
	if err != nil {
		t.Fatalf("llmqtest: listing jobs: %v", err)
		return
	}
	if len(page.Jobs) > 0 {
		t.Fatalf("llmqtest: job %s of kind %q enqueued for tenant %q, expected none", page.Jobs[0].ID, kind.Name(), tenant)
	}
}

func tenantKinds(ctx context.Context, db jobs.DBTX, store jobs.Store, tenant string) []string {
	page, err := store.List(ctx, db, jobs.ListParams{Tenant: tenant, Limit: jobs.MaxListLimit})
	if err != nil {
		return []string{fmt.Sprintf("(unreadable: %v)", err)}
	}
	seen := map[string]bool{}
	for _, j := range page.Jobs {
		seen[j.Kind] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// Attempts returns the job's attempts, oldest first, failing the test if
// they cannot be read.
func Attempts(ctx context.Context, t testing.TB, db jobs.DBTX, store jobs.Store, job *jobs.Job) []jobs.Attempt {
	t.Helper()
	attempts, err := store.Attempts(ctx, db, job.Tenant, job.ID)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return attempts
}

// Steps returns the job's stored durable steps (lease.Step), in the order
// they were stored, failing the test if they cannot be read.
func Steps(ctx context.Context, t testing.TB, db jobs.DBTX, store jobs.Store, job *jobs.Job) []jobs.Step {
	t.Helper()
	steps, err := store.Steps(ctx, db, job.Tenant, job.ID)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return steps
}

// Job reads the job again, failing the test if it cannot.
func Job(ctx context.Context, t testing.TB, db jobs.DBTX, store jobs.Store, job *jobs.Job) *jobs.Job {
	t.Helper()
	j, err := store.Get(ctx, db, job.Tenant, job.ID)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return j
}
