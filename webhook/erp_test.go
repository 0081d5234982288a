package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// The ERP is down (its receiver answers 503) while extractions complete;
// deliveries back off and arrive once it recovers, and when it first commits
// a delivery its answer is lost on the way back: each delivery still lands
// exactly once in the ERP's inbox-backed table, under the delivery id it had
// from the start, and no extraction runs twice.
func TestERPDowntimeDeliversEverythingOnceAfterRecovery(t *testing.T) {
	t.Parallel()
	const n = 8
	sched := []time.Duration{0}
	for range 40 {
		sched = append(sched, 30*time.Millisecond)
	}
	f := setup(t, sched...)
	e := newERP(t, f, 0)
	e.down.Store(true)
	_, _, err := f.store.RegisterEndpoint(t.Context(), f.pool, webhook.EndpointParams{
		Tenant: tenant, URL: e.srv.URL + "/llmq", EventTypes: []string{"invoice.extract.completed"}, Secret: e.key.Secret,
	})
	require.NoError(t, err)

	var mu sync.Mutex
	extractions := map[uuid.UUID]int{}
	extract := lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		mu.Lock()
		extractions[job.ID]++
		mu.Unlock()
		return json.RawMessage(`{"total":"42.00"}`), nil
	})
	cfg := runnerConfig(map[string]lease.Handler{
		"invoice.extract": extract,
		webhook.Kind:      f.dispatcher(webhook.DispatcherConfig{BreakerThreshold: 1000}),
	})
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		if job.Kind != "invoice.extract" {
			return nil
		}
		_, err := f.store.Enqueue(ctx, tx, job.Tenant, webhook.Event{ID: job.ID.String(), Type: "invoice.extract.completed", Payload: job.Result})
		return err
	}
	var ids []uuid.UUID
	for range n {
		res, err := f.jobs.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "invoice.extract", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		ids = append(ids, res.Job.ID)
	}
	f.start(cfg)

	// Every delivery meets the outage a few times before the ERP recovers.
	require.Eventually(t, func() bool { return e.runs.Load() >= 3*n }, 20*time.Second, 10*time.Millisecond)
	e.loseAcks.Store(true)
	e.down.Store(false)

	for _, id := range ids {
		require.Equal(t, jobs.StateSucceeded, f.await(id).State)
	}
	rows, err := f.pool.Query(t.Context(), "SELECT id, (payload->>'delivery_id')::uuid FROM "+f.schema+".jobs WHERE kind = $1", webhook.Kind)
	require.NoError(t, err)
	type pair struct{ job, delivery uuid.UUID }
	deliveries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pair, error) {
		var p pair
		return p, r.Scan(&p.job, &p.delivery)
	})
	require.NoError(t, err)
	require.Len(t, deliveries, n, "one delivery per extraction")
	saw503 := false
	for _, p := range deliveries {
		require.Equal(t, jobs.StateSucceeded, f.await(p.job).State)
		for _, a := range f.attempts(p.delivery) {
			require.Equal(t, p.delivery.String(), a.RequestHeaders["Webhook-Id"], "the delivery id never changes")
			saw503 = saw503 || a.Status == http.StatusServiceUnavailable
		}
	}
	require.True(t, saw503, "the outage was seen")
	require.Equal(t, int64(n), e.lostAcks.Load(), "every first commit lost its answer")

	arrived := e.rows(t)
	require.Len(t, arrived, n)
	for _, p := range deliveries {
		require.Equal(t, 1, arrived[p.delivery.String()], "exactly once in the ERP")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, extractions, n)
	for id, runs := range extractions {
		require.Equal(t, 1, runs, "extraction %s ran once", id)
	}
}
