package jobs_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// claimNew enqueues a job of kind "k" for acme and claims it as worker.
func (f *fixture) claimNew(t *testing.T, worker string) (*jobs.Job, jobs.Lease) {
	t.Helper()
	_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	j := f.claim(t, worker)
	return j, jobs.Lease{JobID: j.ID, Fence: j.Fence}
}

// A step stored by attempt 1 is taken by attempt 2, which is recorded in
// its ReusedBy; the stale attempt 1 can neither take nor store a step once
// attempt 2 holds the job; the history lists the step once.
func TestStepsAreFencedAndReused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	a, leaseA := f.claimNew(t, "worker-a")
	_, found, err := f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: leaseA, Name: "ocr"})
	require.NoError(t, err)
	require.False(t, found, "nothing is stored before the step ran")
	saved, err := f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: leaseA, Name: "ocr",
		Output: json.RawMessage(`{"text":"INVOICE 42"}`), Usage: jobs.Usage{InputTokens: 900, OutputTokens: 40}})
	require.NoError(t, err)
	require.Equal(t, 1, saved.Attempt)
	require.Equal(t, jobs.Usage{InputTokens: 900, OutputTokens: 40}, saved.Usage)

	again, found, err := f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: leaseA, Name: "ocr"})
	require.NoError(t, err)
	require.True(t, found)
	require.Empty(t, again.ReusedBy, "the attempt that stored a step does not reuse it")

	f.expireLease(t, a.ID)
	_, err = f.store.Reap(ctx, f.pool, jobs.ReapParams{Backoff: llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond}})
	require.NoError(t, err)
	// The reaper moved the fence: attempt 1 is stale from here on.
	_, _, err = f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: leaseA, Name: "ocr"})
	require.ErrorIs(t, err, jobs.ErrLeaseLost)
	require.Eventually(t, func() bool {
		j, err := f.store.Get(ctx, f.pool, "acme", a.ID)
		return err == nil && !j.AvailableAt.After(time.Now())
	}, 5*time.Second, 5*time.Millisecond)

	b := f.claim(t, "worker-b")
	leaseB := jobs.Lease{JobID: b.ID, Fence: b.Fence}
	taken, found, err := f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: leaseB, Name: "ocr"})
	require.NoError(t, err)
	require.True(t, found, "attempt 2 takes attempt 1's output")
	require.JSONEq(t, `{"text":"INVOICE 42"}`, string(taken.Output))
	require.Equal(t, 1, taken.Attempt)

	_, err = f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: leaseA, Name: "extract", Output: json.RawMessage(`{"total":1}`)})
	require.ErrorIs(t, err, jobs.ErrLeaseLost, "a stale attempt's step is rejected")
	_, found, err = f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: leaseB, Name: "extract"})
	require.NoError(t, err)
	require.False(t, found, "and never reused")

	_, _, err = f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: leaseB, Name: "ocr"})
	require.NoError(t, err)
	steps, err := f.store.Steps(ctx, f.pool, "acme", a.ID)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, "ocr", steps[0].Name)
	require.Equal(t, []int{2}, steps[0].ReusedBy, "a reuse is recorded once per attempt")

	_, err = f.store.Steps(ctx, f.pool, "other-tenant", a.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound, "steps are read within the job's tenant")
}

// Only the first store of a name counts, even when one attempt stores it
// twice at once: both callers get the same stored output.
func TestSaveStepFirstStoreWins(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, lease := f.claimNew(t, "worker")

	const racers = 8
	outputs := make([]string, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			saved, err := f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: lease, Name: "extract",
				Output: json.RawMessage(`{"racer":` + strconv.Itoa(i) + `}`)})
			if err == nil {
				outputs[i] = string(saved.Output)
			}
		})
	}
	wg.Wait()
	for _, out := range outputs {
		require.NotEmpty(t, out, "every racer got the stored step")
		require.JSONEq(t, outputs[0], out, "and the same one")
	}
	require.Equal(t, 1, f.count(t, "job_steps"))
}

// A step's name and output are checked before anything is written.
func TestSaveStepRejectsBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, lease := f.claimNew(t, "worker")

	for _, tc := range []struct {
		name   string
		params jobs.SaveStepParams
		field  string
	}{
		{"empty name", jobs.SaveStepParams{Lease: lease, Output: json.RawMessage(`1`)}, "Name"},
		{"overlong name", jobs.SaveStepParams{Lease: lease, Name: strings.Repeat("s", jobs.MaxStepNameLen+1), Output: json.RawMessage(`1`)}, "Name"},
		{"no output", jobs.SaveStepParams{Lease: lease, Name: "s"}, "Output"},
		{"not JSON", jobs.SaveStepParams{Lease: lease, Name: "s", Output: json.RawMessage(`{"a":`)}, "Output"},
		{"NUL jsonb cannot hold", jobs.SaveStepParams{Lease: lease, Name: "s", Output: json.RawMessage(`"\u0000"`)}, "Output"},
		{"too large", jobs.SaveStepParams{Lease: lease, Name: "s", Output: json.RawMessage(`"` + strings.Repeat("x", jobs.MaxStepOutputBytes) + `"`)}, "Output"},
		{"negative usage", jobs.SaveStepParams{Lease: lease, Name: "s", Output: json.RawMessage(`1`), Usage: jobs.Usage{InputTokens: -1}}, "Usage"},
	} {
		_, err := f.store.SaveStep(ctx, f.pool, tc.params)
		var invalid *llmqtype.ValidationError
		require.ErrorAs(t, err, &invalid, tc.name)
		require.Equal(t, tc.field, invalid.Field, tc.name)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, tc.name)
		require.Contains(t, err.Error(), tc.field, "%s: the message names the field", tc.name)
	}
	require.Zero(t, f.count(t, "job_steps"), "nothing was written")
}

// The step statements probe the job's primary key and job_steps' (job_id,
// name), whatever the number of stored steps: a step's read or write costs
// the same in a history of millions.
func TestStepStatementsProbeThePrimaryKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.enqueueSpread(t)
	_, err := f.pool.Exec(ctx, `INSERT INTO `+f.schema+`.job_steps (job_id, name, attempt, fence, output)
		SELECT id, name, 1, 1, '{}' FROM `+f.schema+`.jobs, (VALUES ('ocr'), ('extract'), ('validate')) AS s (name)`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "ANALYZE "+f.schema+".jobs, "+f.schema+".job_steps")
	require.NoError(t, err)
	for name, plan := range f.genericPlans(t, "TakeStep", "SaveStep", "ListSteps") {
		require.Contains(t, plan, "jobs_pkey", "%s:\n%s", name, plan)
		require.Contains(t, plan, "job_steps_pkey", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", name, plan)
	}
}

// enqueueSpread fills the jobs table with a batch of MaxBatch jobs over 100
// tenants, so that plans reflect a real table.
func (f *fixture) enqueueSpread(t *testing.T) {
	t.Helper()
	params := make([]jobs.EnqueueParams, jobs.MaxBatch)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "tenant-" + strconv.Itoa(i%100), Kind: "k"}
	}
	_, err := f.store.EnqueueMany(t.Context(), f.pool, params)
	require.NoError(t, err)
}

// genericPlans returns the generic plan of each named statement.
func (f *fixture) genericPlans(t *testing.T, names ...string) map[string]string {
	t.Helper()
	plans := make(map[string]string, len(names))
	for _, name := range names {
		plans[name] = dbtest.GenericPlan(t, f.pool, f.store.QueryForTest(name))
	}
	return plans
}
