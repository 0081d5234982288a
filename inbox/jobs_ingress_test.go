package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/jobs"
)

// A request arriving through the broker becomes a job in the inbox's
// transaction, keyed by the request. Neither a redelivery of the message
// (the same id: an inbox duplicate) nor the request sent again under a new
// message id (the same idempotency key) resets the job, whether it is
// RUNNING or finished: DESIGN's "a redelivery never resets a RUNNING or
// terminal job".
func TestRedeliveryNeverResetsAJob(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := t.Context()
	store, err := jobs.NewStore(jobs.Config{Schema: f.schema})
	require.NoError(t, err)
	b := memory.New(memory.Config{})
	consumer := b.Consumer("requests")
	in, err := f.store.NewIngress(f.pool, consumer, inbox.IngressConfig{
		Consumer: "requests",
		Handler: func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
			_, err := store.Enqueue(ctx, tx, jobs.EnqueueParams{
				Tenant: "acme", Kind: "extract", IdempotencyKey: msg.Key, Payload: msg.Body,
			})
			return err
		},
	})
	require.NoError(t, err)

	request := broker.Message{ID: "msg-1", Topic: "requests", Key: "upload-7f3a", Body: []byte(`{"doc":"sha256:9f86"}`)}
	deliver := func(m broker.Message) {
		t.Helper()
		require.NoError(t, b.Publisher().Publish(ctx, []broker.Message{m}))
		receiveCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		d, err := consumer.Receive(receiveCtx)
		require.NoError(t, err)
		require.NoError(t, in.Handle(ctx, d))
	}
	deliver(request)
	page, err := store.List(ctx, f.pool, jobs.ListParams{Tenant: "acme"})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1)
	job := page.Jobs[0]

	claimed, err := store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: jobs.DefaultQueue, Kinds: []string{"extract"}, Worker: "w", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	running := claimed[0]

	resent := request
	resent.ID = "msg-2" // the producer sent the request again
	for _, m := range []broker.Message{request, resent} {
		deliver(m)
		got, err := store.Get(ctx, f.pool, "acme", job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StateRunning, got.State, "message %s", m.ID)
		require.Equal(t, running.Fence, got.Fence)
		require.Equal(t, running.StateVersion, got.StateVersion)
	}

	res, err := store.Complete(ctx, f.pool, []jobs.Completion{{
		Lease: jobs.Lease{JobID: running.ID, Fence: running.Fence}, Attempt: running.Attempt,
		Worker: "w", Outcome: jobs.OutcomeSucceeded, Result: []byte(`{"total":"42.00"}`),
	}})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	finished := res[0]
	for _, m := range []broker.Message{request, resent} {
		deliver(m)
		got, err := store.Get(ctx, f.pool, "acme", job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StateSucceeded, got.State, "message %s", m.ID)
		require.Equal(t, finished.StateVersion, got.StateVersion)
		require.JSONEq(t, `{"total":"42.00"}`, string(got.Result))
	}
	page, err = store.List(ctx, f.pool, jobs.ListParams{Tenant: "acme"})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1, "no second job")
}
