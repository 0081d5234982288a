package llmqtest_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtest"
)

// Examples for hosts, written as tests since every helper takes the test's
// testing.TB: copy them into a service's own tests.

// A host's test of its own acceptance code: the service row and the job
// commit together, and a retried request leaves one of each.
func TestHostAcceptanceIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	_, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Schema+".uploads (id uuid PRIMARY KEY)")
	require.NoError(t, err)
	hash, err := jobs.RequestHash("d.pdf")
	require.NoError(t, err)
	accept := func() jobs.EnqueueResult {
		res, err := extractKind.Accept(ctx, store, db.Pool, "acme", jobs.EnqueueOptions{IdempotencyKey: "upload-d", RequestHash: hash},
			func(ctx context.Context, tx pgx.Tx) (extractArgs, error) {
				id := uuid.New()
				_, err := tx.Exec(ctx, "INSERT INTO "+db.Schema+".uploads VALUES ($1)", id)
				return extractArgs{Document: id.String()}, err
			})
		require.NoError(t, err)
		return res
	}
	first, again := accept(), accept()
	require.False(t, first.Existing)
	require.True(t, again.Existing)
	require.Equal(t, first.Job.ID, again.Job.ID)
	var uploads int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema+".uploads").Scan(&uploads))
	require.Equal(t, 1, uploads)
}

// A host's test of its handler through a real runner: it fails once, is
// retried, and succeeds; the attempts say so.
func TestHostHandlerIsRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	res, err := extractKind.Enqueue(ctx, store, db.Pool, "acme", extractArgs{Document: "e.pdf"}, jobs.EnqueueOptions{})
	require.NoError(t, err)

	llmqtest.WorkUntilIdle(ctx, t, db, store, lease.Config{Handlers: lease.Kinds(lease.Handle(extractKind, failsOnce))})

	var outcomes []jobs.AttemptOutcome
	for _, a := range llmqtest.Attempts(ctx, t, db.Pool, store, res.Job) {
		outcomes = append(outcomes, a.Outcome)
	}
	require.Equal(t, []jobs.AttemptOutcome{jobs.AttemptRetryScheduled, jobs.AttemptSucceeded}, outcomes)
}
