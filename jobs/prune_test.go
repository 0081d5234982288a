package jobs_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// The pruner's statements read only the due range of one state in
// jobs_finished_idx: never the whole table, and never another state's
// entries (a long-kept dead letter costs pruning succeeded jobs nothing).
func TestPrunerReadsTheFinishedIndex(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	params := make([]jobs.EnqueueParams, jobs.MaxBatch)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: fmt.Sprintf("tenant-%d", i%50), Kind: "k"}
	}
	for range 2 {
		_, err := f.store.EnqueueMany(ctx, f.pool, params)
		require.NoError(t, err)
	}
	// Half the jobs finished, in two states, within two days but never
	// within a minute of the one-day line: the test counts the due jobs
	// and then prunes them, and a job crossing the line in between would
	// be pruned without having been counted.
	_, err := f.pool.Exec(ctx, `UPDATE `+f.schema+`.jobs SET state = CASE WHEN random() < 0.8 THEN 'SUCCEEDED' ELSE 'FAILED_TERMINAL' END,
		finished_at = now() - CASE WHEN random() < 0.5 THEN interval '1 day 1 minute' ELSE interval '0' END - random() * interval '23 hours'
		WHERE random() < 0.5`)
	require.NoError(t, err)
	// Their attempt rows, as Complete writes them.
	_, err = f.pool.Exec(ctx, `INSERT INTO `+f.schema+`.job_attempts (job_id, attempt, fence, worker, started_at, outcome)
		SELECT id, 1, 1, 'w', now(), 'succeeded' FROM `+f.schema+`.jobs WHERE finished_at IS NOT NULL`)
	require.NoError(t, err)
	// Stored steps of a fifth of them, two each, as lease.Step leaves them.
	_, err = f.pool.Exec(ctx, `INSERT INTO `+f.schema+`.job_steps (job_id, name, attempt, fence, output)
		SELECT id, name, 1, 1, '{}' FROM `+f.schema+`.jobs, (VALUES ('ocr'), ('extract')) AS s (name)
		WHERE finished_at IS NOT NULL AND random() < 0.2`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "ANALYZE "+f.schema+".jobs, "+f.schema+".job_keys, "+f.schema+".job_attempts, "+f.schema+".job_steps")
	require.NoError(t, err)
	pruner, err := jobs.NewPruner(f.schema)
	require.NoError(t, err)

	conn, err := f.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// Custom plans: a generic plan estimates LIMIT $3 at a tenth of the
	// due rows and so costs far more than the custom plans of a batch,
	// which PostgreSQL therefore keeps using.
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_custom_plan")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "RESET plan_cache_mode") }()
	for name, args := range map[string]string{"PruneFinished": "'SUCCEEDED', 86400000, 100", "CountFinished": "'SUCCEEDED', 86400000", "OldestFinished": "'SUCCEEDED'"} {
		_, err := conn.Exec(ctx, "PREPARE prune_check AS "+pruner.PruneQueryForTest(name))
		require.NoError(t, err)
		rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) EXECUTE prune_check("+args+")")
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "DEALLOCATE prune_check")
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.Contains(t, plan, "jobs_finished_idx", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", name, plan)
	}

	// Its results: exactly the due jobs of the state, with their keys.
	var due int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.schema+`.jobs WHERE state = 'SUCCEEDED' AND finished_at < now() - interval '1 day'`).Scan(&due))
	n, err := pruner.CountFinished(ctx, f.pool, jobs.StateSucceeded, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, due, n)
	var attemptsDue int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM `+f.schema+`.job_attempts a JOIN `+f.schema+`.jobs j ON j.id = a.job_id
		WHERE j.state = 'SUCCEEDED' AND j.finished_at < now() - interval '1 day'`).Scan(&attemptsDue))
	require.Equal(t, due, attemptsDue)
	var total jobs.PruneResult
	for {
		r, err := pruner.PruneFinished(ctx, f.pool, jobs.StateSucceeded, 24*time.Hour, 500)
		require.NoError(t, err)
		total.Jobs += r.Jobs
		total.Keys += r.Keys
		total.Attempts += r.Attempts
		if r.Jobs < 500 {
			break
		}
	}
	require.Equal(t, due, total.Jobs)
	require.Equal(t, due, total.Keys)
	require.Equal(t, due, total.Attempts)
	n, err = pruner.CountFinished(ctx, f.pool, jobs.StateSucceeded, 24*time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = pruner.PruneFinished(ctx, f.pool, jobs.StateRunning, time.Hour, 10)
	require.ErrorIs(t, err, jobs.ErrInvalidParams, "only finished states are pruned")
	_, err = pruner.PruneFinished(ctx, f.pool, jobs.StateSucceeded, 0, 10)
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
	_, err = pruner.PruneFinished(ctx, f.pool, jobs.StateSucceeded, time.Hour, jobs.MaxPruneBatch+1)
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
}

// An Enqueue that finds its key taken, then no job holding it (pruned
// between its two statements), fails with the typed, retryable
// ErrKeyReleased and writes nothing. The race is narrow, so the state it
// leaves the second statement in is built directly: the key's job_keys row
// without its job.
func TestEnqueueFindingItsKeyReleasedIsRetryable(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	params := jobs.EnqueueParams{Tenant: "acme", Kind: "k", IdempotencyKey: "order-1"}
	first, err := f.store.Enqueue(ctx, f.pool, params)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "DELETE FROM "+f.schema+".jobs WHERE id = $1", first.Job.ID)
	require.NoError(t, err)

	_, err = f.store.Enqueue(ctx, f.pool, params)
	require.ErrorIs(t, err, jobs.ErrKeyReleased)
	_, err = f.store.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{{Tenant: "acme", Kind: "k"}, params})
	require.ErrorIs(t, err, jobs.ErrKeyReleased)
	require.Zero(t, f.count(t, "jobs"), "nothing was written")
}

// Enqueues racing the pruning of the job holding their key: each returns
// the old job (before the prune), a new job (after), or ErrKeyReleased
// (in between), and a retry of ErrKeyReleased creates the new job.
func TestEnqueueRacingAPruneOfItsKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	pruner, err := jobs.NewPruner(f.schema)
	require.NoError(t, err)
	for round := range 100 {
		params := jobs.EnqueueParams{Tenant: "acme", Kind: "k", IdempotencyKey: fmt.Sprintf("key-%d", round)}
		old, err := f.store.Enqueue(ctx, f.pool, params)
		require.NoError(t, err)
		_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET state = 'SUCCEEDED', finished_at = now() - interval '1 hour' WHERE id = $1", old.Job.ID)
		require.NoError(t, err)

		pruned := make(chan error, 1)
		go func() {
			_, err := pruner.PruneFinished(ctx, f.pool, jobs.StateSucceeded, time.Minute, 10)
			pruned <- err
		}()
		res, err := f.store.Enqueue(ctx, f.pool, params)
		require.NoError(t, <-pruned)
		if errors.Is(err, jobs.ErrKeyReleased) {
			res, err = f.store.Enqueue(ctx, f.pool, params)
		}
		require.NoError(t, err)
		if res.Existing {
			require.Equal(t, old.Job.ID, res.Job.ID)
			continue
		}
		require.NotEqual(t, old.Job.ID, res.Job.ID, "a new job once the old one is pruned")
	}
}
