package lease_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtest"
)

type sumArgs struct{ A, B int }

var sum = jobs.NewKind[sumArgs, int]("math.sum")

func add(_ context.Context, _ *jobs.Job, args sumArgs) (int, error) { return args.A + args.B, nil }

// Through the runner, a typed handler's result is the job's, and a payload
// that does not decode fails its job at once with its own class.
func TestTypedHandlerThroughTheRunner(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	good, err := sum.Enqueue(ctx, store, db.Pool, "acme", sumArgs{A: 2, B: 3}, jobs.EnqueueOptions{})
	require.NoError(t, err)
	bad, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: sum.Name(), Payload: []byte(`{"A": "two"}`)})
	require.NoError(t, err)

	llmqtest.WorkUntilIdle(ctx, t, db, store, lease.Config{Handlers: lease.Kinds(lease.Handle(sum, add))})

	job := llmqtest.Job(ctx, t, db.Pool, store, good.Job)
	total, err := sum.Result(job)
	require.NoError(t, err)
	require.Equal(t, 5, total)
	job = llmqtest.Job(ctx, t, db.Pool, store, bad.Job)
	require.Equal(t, jobs.StateFailedTerminal, job.State)
	require.Equal(t, jobs.ClassMalformedPayload, job.ErrorClass)
	require.Len(t, llmqtest.Attempts(ctx, t, db.Pool, store, job), 1, "not retried")
}

// A kind registered twice is a program error.
func TestKindsRefusesADuplicate(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, `lease: kind "math.sum" registered twice`, func() {
		lease.Kinds(lease.Handle(sum, add), lease.Handle(sum, add))
	})
}

// Start runs the runner until stop, which returns Run's result.
func TestStartAndStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	runner, err := lease.NewRunner(db.Pool, store, lease.Config{Handlers: lease.Kinds(lease.Handle(sum, add))})
	require.NoError(t, err)
	stop := runner.Start(ctx)
	res, err := sum.Enqueue(ctx, store, db.Pool, "acme", sumArgs{A: 1, B: 1}, jobs.EnqueueOptions{})
	require.NoError(t, err)
	job, err := jobs.Await(ctx, store, db.Pool, "acme", res.Job.ID, 0)
	require.NoError(t, err)
	require.Equal(t, jobs.StateSucceeded, job.State)
	require.NoError(t, stop())
}

// A typed handler's review carries its typed result to the job.
func TestTypedReview(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	res, err := sum.Enqueue(ctx, store, db.Pool, "acme", sumArgs{A: 1, B: 1}, jobs.EnqueueOptions{})
	require.NoError(t, err)
	review := func(context.Context, *jobs.Job, sumArgs) (int, error) {
		return 0, sum.NeedsReview(3, "1 + 1 looks odd")
	}

	llmqtest.WorkUntilIdle(ctx, t, db, store, lease.Config{Handlers: lease.Kinds(lease.Handle(sum, review))})

	job := llmqtest.Job(ctx, t, db.Pool, store, res.Job)
	require.Equal(t, jobs.StateReviewRequired, job.State)
	got, err := sum.Result(job)
	require.NoError(t, err)
	require.Equal(t, 3, got)
}
