package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
)

// The queue gauges report what the database holds: runnable, scheduled and
// running jobs per queue, and the age of the oldest runnable job.
func TestGaugesMatchDatabase(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	m := telemetrytest.NewMetrics(t)

	for range 3 {
		_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "t1", Kind: "k", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "t1", Kind: "k", Payload: json.RawMessage(`{}`),
		AvailableAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "t2", Kind: "k", Queue: "webhooks", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	// One runnable job has been due for an hour.
	_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET available_at = now() - interval '1 hour' "+
		"WHERE id = (SELECT id FROM "+f.schema+".jobs WHERE queue = 'default' AND state = 'READY' AND available_at <= now() LIMIT 1)")
	require.NoError(t, err)

	reg, err := f.store.RegisterGauges(f.pool, jobs.GaugeConfig{MeterProvider: m.Provider, Refresh: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Unregister()) })
	r := m.Collect(t)

	// The same counts, straight from the table.
	var want struct{ runnable, scheduled, running int64 }
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE state IN ('READY', 'RETRY_SCHEDULED') AND available_at <= now()),
		count(*) FILTER (WHERE state IN ('READY', 'RETRY_SCHEDULED') AND available_at > now()),
		count(*) FILTER (WHERE state = 'RUNNING')
		FROM `+f.schema+`.jobs WHERE queue = 'default'`).Scan(&want.runnable, &want.scheduled, &want.running))
	require.Equal(t, struct{ runnable, scheduled, running int64 }{2, 1, 1}, want)
	q := attribute.String("queue", "default")
	for state, n := range map[string]int64{"runnable": want.runnable, "scheduled": want.scheduled, "running": want.running} {
		got, ok := r.Int("llmq.jobs", q, attribute.String("state", state))
		require.True(t, ok, state)
		require.Equal(t, n, got, state)
	}
	got, _ := r.Int("llmq.jobs", attribute.String("queue", "webhooks"), attribute.String("state", "runnable"))
	require.EqualValues(t, 1, got)
	age, ok := r.Float("llmq.jobs.oldest_runnable_age", q)
	require.True(t, ok)
	require.InDelta(t, time.Hour.Seconds(), age, 60)

	// Within Refresh a scrape reuses the reading: no query per scrape.
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "t1", Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	got, _ = m.Collect(t).Int("llmq.jobs", q, attribute.String("state", "runnable"))
	require.Equal(t, want.runnable, got)
}

// Depth can read the backlog through indexes of unfinished jobs alone: with
// sequential scans priced out, its plan has none, so finished jobs need not
// cost it anything. (With a backlog that is a large share of the table the
// planner may still prefer a sequential scan, as it should.)
func TestDepthUsesIndexes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	conn, err := f.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// The planner is told a seq scan costs far more; a plan that still needs
	// one has no index to use.
	_, err = conn.Exec(ctx, "SET enable_seqscan = off")
	require.NoError(t, err)
	var plan string
	require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+f.store.QueryForTest("QueueDepth")).Scan(&plan))
	require.NotContains(t, plan, `"Seq Scan"`)
}

// A job accepted under a span stores that span's traceparent, and its
// requested event carries it as a header.
func TestEnqueueStoresTraceParent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tr := telemetrytest.NewTraces(t)
	ctx, span := tr.Provider.Tracer("test").Start(t.Context(), "accept")
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "t1", Kind: "k", Payload: json.RawMessage(`{}`)})
	span.End()
	require.NoError(t, err)
	sc := span.SpanContext()
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	require.Equal(t, want, res.Job.TraceParent)

	var header string
	require.NoError(t, f.pool.QueryRow(context.Background(),
		"SELECT headers->>'traceparent' FROM "+dbtest.OutboxEvents(f.schema, "o")+" WHERE aggregate_id = $1", res.Job.ID).Scan(&header))
	require.Equal(t, want, header)

	// Outside a trace nothing is stored.
	res, err = f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "t1", Kind: "k", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.Empty(t, res.Job.TraceParent)
}
