package jobs_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

func batchOf(key string, n int) jobs.EnqueueBatchParams {
	p := jobs.EnqueueBatchParams{Tenant: "acme", Key: key}
	for i := range n {
		p.Jobs = append(p.Jobs, jobs.EnqueueParams{Kind: "k", Payload: json.RawMessage(`{"doc":` + strconv.Itoa(i) + `}`)})
	}
	return p
}

// batchEvents counts the outbox's batch.completed events for a batch.
func (f *fixture) batchEvents(t *testing.T, id uuid.UUID) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+dbtest.OutboxEvents(f.schema, "o")+" WHERE event_type = $1 AND aggregate_id = $2",
		jobs.BatchCompletedEvent, id).Scan(&n))
	return n
}

// A batch is accepted once per key: again with the same jobs it is the
// batch already accepted and writes nothing; with other jobs it is
// refused. Bad input is refused before anything is written, naming the
// field.
func TestEnqueueBatchIsIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	first, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-1", 3))
	require.NoError(t, err)
	require.False(t, first.Existing)
	require.Len(t, first.Jobs, 3)
	require.Equal(t, 3, first.Batch.Total)
	require.Zero(t, first.Batch.Finished)
	for _, j := range first.Jobs {
		require.Equal(t, first.Batch.ID, j.BatchID, "each job knows its batch")
	}
	plain, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	require.Equal(t, uuid.Nil, plain.Job.BatchID)

	again, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-1", 3))
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, first.Batch.ID, again.Batch.ID)
	require.Equal(t, ids(first.Jobs), ids(again.Jobs), "the same jobs, in input order")
	require.Equal(t, 4, f.count(t, "jobs"), "nothing more was written")

	_, err = f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-1", 4))
	require.ErrorIs(t, err, jobs.ErrBatchConflict)

	for _, tc := range []struct {
		name   string
		mutate func(*jobs.EnqueueBatchParams)
		field  string
	}{
		{"no key", func(p *jobs.EnqueueBatchParams) { p.Key = "" }, "Key"},
		{"no jobs", func(p *jobs.EnqueueBatchParams) { p.Jobs = nil }, "Jobs"},
		{"a job's own key", func(p *jobs.EnqueueBatchParams) { p.Jobs[1].IdempotencyKey = "k" }, "Jobs[1].IdempotencyKey"},
		{"another tenant's job", func(p *jobs.EnqueueBatchParams) { p.Jobs[0].Tenant = "globex" }, "Jobs[0].Tenant"},
		{"a bad kind", func(p *jobs.EnqueueBatchParams) { p.Jobs[1].Kind = "no spaces" }, "Jobs[1].Kind"},
		{"the one job's bad kind", func(p *jobs.EnqueueBatchParams) { p.Jobs = p.Jobs[:1]; p.Jobs[0].Kind = "" }, "Jobs[0].Kind"},
		{"too many", func(p *jobs.EnqueueBatchParams) { p.Jobs = make([]jobs.EnqueueParams, jobs.MaxBatch+1) }, "Jobs"},
	} {
		p := batchOf("upload-bad", 2)
		tc.mutate(&p)
		_, err := f.store.EnqueueBatch(ctx, f.pool, p)
		var invalid *llmqtype.ValidationError
		require.ErrorAs(t, err, &invalid, tc.name)
		require.Equal(t, tc.field, invalid.Field, tc.name)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, tc.name)
	}
	require.Equal(t, 4, f.count(t, "jobs"), "no refused batch wrote a job")
	require.Equal(t, 1, f.count(t, "job_batches"), "or a batch")
}

func ids(js []*jobs.Job) []uuid.UUID {
	out := make([]uuid.UUID, len(js))
	for i, j := range js {
		out[i] = j.ID
	}
	return out
}

// A repeated acceptance of a batch returns its jobs in input order, also
// for a batch as large as allowed, whose ids are made many to a
// millisecond; once retention has pruned any of them, it returns none
// rather than a list that no longer lines up with the input.
func TestRepeatedBatchReturnsItsJobsInInputOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	first, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-big", jobs.MaxBatch))
	require.NoError(t, err)
	again, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-big", jobs.MaxBatch))
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, ids(first.Jobs), ids(again.Jobs))
	for i, j := range again.Jobs {
		require.JSONEq(t, `{"doc":`+strconv.Itoa(i)+`}`, string(j.Payload), "job %d is input %d", i, i)
	}

	_, err = f.pool.Exec(ctx, "DELETE FROM "+f.schema+".jobs WHERE id = $1", first.Jobs[7].ID)
	require.NoError(t, err)
	pruned, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-big", jobs.MaxBatch))
	require.NoError(t, err)
	require.True(t, pruned.Existing)
	require.Equal(t, first.Batch.ID, pruned.Batch.ID)
	require.Nil(t, pruned.Jobs)

	other, err := f.store.EnqueueBatch(ctx, f.pool, jobs.EnqueueBatchParams{Tenant: "globex", Key: "upload-big", Jobs: batchOf("", 2).Jobs})
	require.NoError(t, err)
	require.False(t, other.Existing, "another tenant's key is its own")
}

// A batch's counts follow its jobs through every way a job finishes
// (success, a permanent failure, a cancel while waiting, a lease that
// expired with no attempts left, a deadline), in the statement of the
// transition itself; the last one writes the batch's one completion event.
func TestBatchProgressFollowsEveryTransition(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	p := batchOf("upload-2", 5)
	p.Jobs[3].MaxAttempts = 1
	p.Jobs[4].DeadlineAt = time.Now().Add(2 * time.Hour)
	p.Jobs[4].AvailableAt = time.Now().Add(time.Hour) // not claimed before its deadline
	res, err := f.store.EnqueueBatch(ctx, f.pool, p)
	require.NoError(t, err)
	id := res.Batch.ID
	progress := func() *jobs.Batch {
		t.Helper()
		b, err := f.store.Batch(ctx, f.pool, "acme", id)
		require.NoError(t, err)
		return b
	}

	claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 4, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 4)
	byDoc := map[string]*jobs.Job{}
	for _, j := range claimed {
		byDoc[string(j.Payload)] = j
	}
	ok, bad, cancelled, expires := byDoc[`{"doc": 0}`], byDoc[`{"doc": 1}`], byDoc[`{"doc": 2}`], byDoc[`{"doc": 3}`]
	require.NotNil(t, expires)
	failed := succeeded(bad, "")
	failed.Result, failed.Outcome, failed.ErrorClass, failed.Error = nil, jobs.OutcomeFailed, jobs.ClassPermanent, "400"
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(ok, `{"total":1}`), failed})
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}
	require.Equal(t, jobs.Batch{Total: 5, Finished: 2, Succeeded: 1, Failed: 1}, counts(progress()))

	// A running job's cancel is a request; its runner records CANCELLED.
	_, err = f.store.Cancel(ctx, f.pool, "acme", cancelled.ID)
	require.NoError(t, err)
	require.Equal(t, 2, progress().Finished, "a cancel request finishes nothing")
	gone := succeeded(cancelled, "")
	gone.Result, gone.Outcome = nil, jobs.OutcomeCancelled
	_, err = f.store.Complete(ctx, f.pool, []jobs.Completion{gone})
	require.NoError(t, err)
	require.Equal(t, jobs.Batch{Total: 5, Finished: 3, Succeeded: 1, Failed: 1, Cancelled: 1}, counts(progress()))

	f.expireLease(t, expires.ID)
	f.setState(t, res.Jobs[4].ID, "deadline_at = now() - interval '1 second'")
	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.LeaseFailed)
	require.Equal(t, 1, reaped.DeadlineFail)
	done := progress()
	require.Equal(t, jobs.Batch{Total: 5, Finished: 5, Succeeded: 1, Failed: 3, Cancelled: 1}, counts(done))
	require.True(t, done.Done())
	require.False(t, done.FinishedAt.IsZero())
	require.Equal(t, 1, f.batchEvents(t, id), "one completion event")

	var raw []byte
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT payload FROM "+dbtest.OutboxEvents(f.schema, "o")+" WHERE event_type = $1", jobs.BatchCompletedEvent).Scan(&raw))
	var payload map[string]any
	require.NoError(t, json.Unmarshal(raw, &payload))
	require.Equal(t, map[string]any{"batch_id": id.String(), "tenant": "acme", "batch_key": "upload-2", "total": 5.0,
		"succeeded": 1.0, "review_required": 0.0, "failed": 3.0, "cancelled": 1.0}, payload)
	parsed, err := jobs.ParseBatchCompleted(raw)
	require.NoError(t, err)
	done.CreatedAt, done.FinishedAt = time.Time{}, time.Time{} // not in the event
	require.Equal(t, done, parsed, "the event parses into the batch as its last job left it")

	// Every lifecycle event of a batch's job names its batch, so a
	// consumer of the events can follow the batch; a job outside one
	// carries no batch_id at all.
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	var lifecycle, named, outside int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE aggregate_id <> $2),
			count(*) FILTER (WHERE payload->>'batch_id' = $2::text),
			count(*) FILTER (WHERE aggregate_id NOT IN (SELECT id FROM `+f.schema+`.jobs WHERE batch_id IS NOT NULL) AND payload ? 'batch_id')
		FROM `+dbtest.OutboxEvents(f.schema, "o")+` WHERE event_type <> $1`, jobs.BatchCompletedEvent, id).Scan(&lifecycle, &named, &outside))
	require.Equal(t, 5+5+1, lifecycle, "five accepted, five finished, one plain job accepted")
	require.Equal(t, 10, named)
	require.Zero(t, outside)

	_, err = f.store.Batch(ctx, f.pool, "globex", id)
	require.ErrorIs(t, err, jobs.ErrNotFound, "a batch is read within its tenant")
}

// counts keeps a batch's counts only, for comparison.
func counts(b *jobs.Batch) jobs.Batch {
	return jobs.Batch{Total: b.Total, Finished: b.Finished, Succeeded: b.Succeeded, ReviewRequired: b.ReviewRequired,
		Failed: b.Failed, Cancelled: b.Cancelled}
}

// CancelBatch cancels the waiting jobs at once and asks the running ones
// to stop; when their runners record the cancellation, the batch is done.
func TestCancelBatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	res, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-3", 5))
	require.NoError(t, err)
	running, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 2, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, running, 2)

	c, err := f.store.CancelBatch(ctx, f.pool, "acme", res.Batch.ID)
	require.NoError(t, err)
	require.Equal(t, 3, c.Cancelled)
	require.Equal(t, 2, c.Requested)
	require.Equal(t, jobs.Batch{Total: 5, Finished: 3, Cancelled: 3}, counts(c.Batch))
	require.Zero(t, f.batchEvents(t, res.Batch.ID))

	var stop []jobs.Completion
	for _, j := range running {
		c := succeeded(j, "")
		c.Result, c.Outcome = nil, jobs.OutcomeCancelled
		stop = append(stop, c)
	}
	_, err = f.store.Complete(ctx, f.pool, stop)
	require.NoError(t, err)
	b, err := f.store.Batch(ctx, f.pool, "acme", res.Batch.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.Batch{Total: 5, Finished: 5, Cancelled: 5}, counts(b))
	require.Equal(t, 1, f.batchEvents(t, res.Batch.ID))
	var named int
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM "+dbtest.OutboxEvents(f.schema, "o")+" WHERE event_type = 'k.cancelled' AND payload->>'batch_id' = $1::text",
		res.Batch.ID).Scan(&named))
	require.Equal(t, 5, named, "each cancelled job's event names its batch")

	again, err := f.store.CancelBatch(ctx, f.pool, "acme", res.Batch.ID)
	require.NoError(t, err)
	require.Zero(t, again.Cancelled+again.Requested, "a finished batch has nothing left to cancel")
	_, err = f.store.CancelBatch(ctx, f.pool, "globex", res.Batch.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound)
}

// Reading a batch is one primary-key probe; listing or cancelling its
// jobs walks them through jobs_batch_idx, whatever else the table holds; pruning
// batches reads the due range of job_batches_finished_idx.
func TestBatchStatementsUseTheirIndexes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.enqueueSpread(t)
	for i := range 20 {
		_, err := f.store.EnqueueBatch(ctx, f.pool, batchOf("upload-"+strconv.Itoa(i), 50))
		require.NoError(t, err)
	}
	// And the batches of months of uploads.
	_, err := f.pool.Exec(ctx, `INSERT INTO `+f.schema+`.job_batches (id, tenant, batch_key, request_hash, topic, total, finished, finished_at)
		SELECT gen_random_uuid(), 'tenant-' || n % 100, 'old-' || n, 'h', 't', 50, 50, now() - n * interval '1 minute'
		FROM generate_series(1, 20000) AS n`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "ANALYZE "+f.schema+".jobs, "+f.schema+".job_batches")
	require.NoError(t, err)
	want := map[string][]string{
		"GetBatch":      {"job_batches_pkey"},
		"GetBatchByKey": {"job_batches_tenant_batch_key_key"},
		"ListBatchJobs": {"jobs_batch_idx"},
		"CancelBatch":   {"jobs_batch_idx", "job_batches_pkey"},
		"PruneBatches":  {"job_batches_finished_idx"},
		"CountBatches":  {"job_batches_finished_idx"},
	}
	for name, plan := range f.genericPlans(t, "GetBatch", "GetBatchByKey", "ListBatchJobs", "CancelBatch", "PruneBatches", "CountBatches") {
		for _, index := range want[name] {
			require.Contains(t, plan, index, "%s:\n%s", name, plan)
		}
		require.NotContains(t, plan, "Seq Scan on jobs", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on job_batches", "%s:\n%s", name, plan)
	}
}
