package lease_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// A batch of 10,000 jobs worked by 4 runners at once: its progress equals
// what its jobs' rows say at every sample (read in one snapshot), and it
// gets exactly one batch.completed event, though its last jobs finish on
// different runners at the same time.
func TestBatchOverFourRunners(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 20})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	ctx := t.Context()

	const n = 10_000
	params := jobs.EnqueueBatchParams{Tenant: "acme", Key: "upload-10k"}
	for i := range n {
		params.Jobs = append(params.Jobs, jobs.EnqueueParams{Kind: "invoice.extract", Payload: json.RawMessage(`{"doc":` + strconv.Itoa(i) + `}`)})
	}
	start := time.Now()
	res, err := store.EnqueueBatch(ctx, db.Pool, params)
	require.NoError(t, err)
	t.Logf("a batch of %d jobs accepted in %v", n, time.Since(start).Round(time.Millisecond))
	id := res.Batch.ID

	handler := lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return json.RawMessage(`{"ok":true}`), nil })
	var stops []func() error
	for i := range 4 {
		cfg := fastConfig(map[string]lease.Handler{"invoice.extract": handler})
		cfg.WorkerID = "runner-" + strconv.Itoa(i)
		cfg.Queues = map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 50}}
		r, err := lease.NewRunner(db.Pool, store, cfg)
		require.NoError(t, err)
		stops = append(stops, r.Start(context.Background()))
	}
	defer func() {
		for _, stop := range stops {
			require.NoError(t, stop())
		}
	}()

	samples := 0
	for {
		var b *jobs.Batch
		var finished, succeeded int
		err := pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			var err error
			if b, err = store.Batch(ctx, tx, "acme", id); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')),
				count(*) FILTER (WHERE state = 'SUCCEEDED') FROM `+db.Schema+`.jobs WHERE batch_id = $1`, id).Scan(&finished, &succeeded)
		})
		require.NoError(t, err)
		samples++
		require.Equal(t, finished, b.Finished, "sample %d: the batch's count is its jobs'", samples)
		require.Equal(t, succeeded, b.Succeeded, "sample %d", samples)
		if b.Done() {
			require.Equal(t, n, b.Succeeded)
			break
		}
	}
	t.Logf("%d samples, each equal to the job table", samples)
	require.Greater(t, samples, 2, "progress was sampled while the batch ran")
	var events int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+dbtest.OutboxEvents(db.Schema, "o")+" WHERE event_type = $1 AND aggregate_id = $2",
		jobs.BatchCompletedEvent, id).Scan(&events))
	require.Equal(t, 1, events, "exactly one batch.completed")
}
