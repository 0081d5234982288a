package webhook_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/webhook"
)

// Age alone never prunes a delivery: one whose job is waiting, retrying or
// running may wait behind its endpoint's backlog, or on 401/403 slowdowns
// and Retry-After, far longer than any schedule, and one whose job is a
// dead letter (or a replay of one) must be found when it is replayed. Only
// deliveries whose jobs all succeeded, or are gone, are pruned.
func TestPruneKeepsDeliveriesWhoseJobIsNotDone(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	ep, _ := f.register(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	pruner, err := webhook.NewPruner(f.schema)
	require.NoError(t, err)

	one := func(id string) webhook.Delivery {
		ds := f.enqueue(webhook.Event{ID: id})
		require.Len(t, ds, 1)
		require.Equal(t, ep.ID, ds[0].EndpointID)
		return ds[0]
	}
	setState := func(job uuid.UUID, state jobs.State) {
		t.Helper()
		finished := state.Terminal()
		_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET state = $2, finished_at = CASE WHEN $3 THEN now() END WHERE id = $1",
			job, string(state), finished)
		require.NoError(t, err)
	}
	deleteJob := func(job uuid.UUID) { // as retention prunes a finished job
		t.Helper()
		_, err := f.pool.Exec(ctx, "DELETE FROM "+f.schema+".jobs WHERE id = $1", job)
		require.NoError(t, err)
	}

	waiting := one("waiting")
	retrying := one("retrying")
	setState(retrying.JobID, jobs.StateRetryScheduled)
	dead := one("dead")
	setState(dead.JobID, jobs.StateFailedTerminal)
	replayed := one("replayed")
	setState(replayed.JobID, jobs.StateFailedTerminal)
	replay, err := f.jobs.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: tenant, JobID: replayed.JobID, By: "ops", Reason: "endpoint fixed"})
	require.NoError(t, err)
	deleteJob(replayed.JobID) // the dead letter is pruned; its replay still waits
	done := one("done")
	setState(done.JobID, jobs.StateSucceeded)
	orphan := one("orphan")
	setState(orphan.JobID, jobs.StateSucceeded)
	deleteJob(orphan.JobID)

	// Created 400 days ago, a minute apart in enqueue order: the kept
	// deliveries are the oldest.
	_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+".webhook_deliveries AS d SET created_at = now() - interval '400 days' + o.n * interval '1 minute' "+
		"FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM "+f.schema+".webhook_deliveries) AS o WHERE o.id = d.id")
	require.NoError(t, err)

	due, err := pruner.Count(ctx, f.pool, 31*24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(2), due, "Count counts what Prune deletes")
	n, err := f.store.Prune(ctx, f.pool, 1)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "a batch of one")
	n, err = f.store.Prune(ctx, f.pool, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the kept deliveries, older than both, do not stop the batch")
	for _, d := range []webhook.Delivery{done, orphan} {
		_, err = f.store.Delivery(ctx, f.pool, tenant, d.ID)
		require.ErrorIs(t, err, webhook.ErrNotFound, "delivery %s", d.EventID)
	}
	for _, d := range []webhook.Delivery{waiting, retrying, dead, replayed} {
		_, err = f.store.Delivery(ctx, f.pool, tenant, d.ID)
		require.NoError(t, err, "delivery %s must be kept", d.EventID)
	}

	// The dead letter is kept for as long as retention keeps its job, and
	// pruned once the job is gone; the replay, once it succeeded.
	deleteJob(dead.JobID)
	setState(replay.Job.ID, jobs.StateSucceeded)
	n, err = pruner.Prune(ctx, f.pool, 31*24*time.Hour, webhook.MaxPruneBatch)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	for _, d := range []webhook.Delivery{dead, replayed} {
		_, err = f.store.Delivery(ctx, f.pool, tenant, d.ID)
		require.ErrorIs(t, err, webhook.ErrNotFound, "delivery %s", d.EventID)
	}
	_, err = f.store.Delivery(ctx, f.pool, tenant, waiting.ID)
	require.NoError(t, err)
	_, err = f.store.Delivery(ctx, f.pool, tenant, retrying.ID)
	require.NoError(t, err)
}

// Whatever the jobs table holds, pruning finds each candidate delivery's
// jobs with one probe of jobs_webhook_delivery_idx, never by reading the
// other jobs.
func TestPruneProbesTheDeliveryJobsIndex(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.register(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	for i := range 20 {
		f.enqueue(webhook.Event{ID: fmt.Sprintf("e-%d", i)})
	}
	// And many other jobs, waiting and finished.
	others := make([]jobs.EnqueueParams, jobs.MaxBatch)
	for i := range others {
		others[i] = jobs.EnqueueParams{Tenant: fmt.Sprintf("t-%d", i%50), Kind: "other.kind"}
	}
	for range 2 {
		_, err := f.jobs.EnqueueMany(ctx, f.pool, others)
		require.NoError(t, err)
	}
	_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET state = 'SUCCEEDED', finished_at = now() WHERE kind = 'other.kind' AND random() < 0.7")
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "ANALYZE "+f.schema+".jobs, "+f.schema+".webhook_deliveries")
	require.NoError(t, err)

	prune, count := webhook.PruneQueriesForTest(f.store)
	for name, q := range map[string]string{"PruneDeliveries": prune, "CountDeliveries": count} {
		plan := dbtest.GenericPlan(t, f.pool, q)
		require.Contains(t, plan, "jobs_webhook_delivery_idx", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on jobs", "%s:\n%s", name, plan)
	}
}
