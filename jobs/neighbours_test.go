package jobs_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// An attempt given up as hung: its fence moves on at once, its row says
// hung and uncertain, the job stays RUNNING until its lease expires, the
// reaper then takes it back with the class "hung", and the hung handler's
// late completion changes nothing and is recorded stale on its own row.
func TestMarkHung(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	j := f.claim(t, "w")

	marked, err := f.store.MarkHung(ctx, f.pool, "other", []jobs.HungAttempt{{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}}})
	require.NoError(t, err)
	require.Empty(t, marked, "only the lease holder gives its attempt up")

	marked, err = f.store.MarkHung(ctx, f.pool, "w", []jobs.HungAttempt{{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Error: "still running 2s after its timeout"}})
	require.NoError(t, err)
	require.Equal(t, []jobs.Lease{{JobID: j.ID, Fence: j.Fence + 1}}, marked)
	got, err := f.store.Get(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateRunning, got.State, "the job waits for its lease to expire")
	require.Equal(t, j.LeaseUntil, got.LeaseUntil)
	attempts, err := f.store.Attempts(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.AttemptHung, attempts[0].Outcome)
	require.Equal(t, jobs.ClassHung, attempts[0].ErrorClass)
	require.True(t, attempts[0].Usage.Uncertain)
	require.Equal(t, j.Fence, attempts[0].Fence)

	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Zero(t, reaped.Rescheduled, "the lease has not expired yet")

	f.expireLease(t, j.ID)
	reaped, err = f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Rescheduled)
	got, err = f.store.Get(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateRetryScheduled, got.State)
	require.Equal(t, jobs.ClassHung, got.ErrorClass)
	require.Contains(t, got.LastError, "hung")
	attempts, err = f.store.Attempts(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.AttemptHung, attempts[0].Outcome, "the reaper keeps the hung attempt's row")
	require.Equal(t, got.AvailableAt, attempts[0].RetryAt)

	res, err := f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(j, `{"late":true}`)})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, jobs.ErrLeaseLost)
	attempts, err = f.store.Attempts(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptStale, attempts[0].Outcome)
	require.Contains(t, attempts[0].Error, "the attempt had ended: hung")
	require.True(t, attempts[0].Usage.Uncertain)
}

// A hung attempt whose job has no attempts left fails with the class hung.
func TestReapFailsAHungJobWithoutAttemptsLeft(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", MaxAttempts: 1})
	require.NoError(t, err)
	j := f.claim(t, "w")
	_, err = f.store.MarkHung(ctx, f.pool, "w", []jobs.HungAttempt{{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}}})
	require.NoError(t, err)
	f.expireLease(t, j.ID)
	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.LeaseFailed)
	got, err := f.store.Get(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateFailedTerminal, got.State)
	require.Equal(t, jobs.ClassHung, got.ErrorClass)
	require.Contains(t, got.LastError, "no attempts left")
}

// A hung handler that returns before its abandoned lease expires has its
// attempt recorded stale, still of the class hung, and the reaper then
// records the job as hung, as it does when the handler never returns.
func TestReapKeepsTheHungClassAfterALateCompletion(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	j := f.claim(t, "w")
	_, err = f.store.MarkHung(ctx, f.pool, "w", []jobs.HungAttempt{{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}}})
	require.NoError(t, err)

	res, err := f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(j, `{"late":true}`)})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].Err, jobs.ErrLeaseLost)
	attempts, err := f.store.Attempts(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.AttemptStale, attempts[0].Outcome)
	require.Equal(t, jobs.ClassHung, attempts[0].ErrorClass, "the late completion erased why the attempt was given up")

	f.expireLease(t, j.ID)
	reaped, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Rescheduled)
	got, err := f.store.Get(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.ClassHung, got.ErrorClass, "the job's class depends on when the hung handler returned")
	require.Contains(t, got.LastError, "hung")
	attempts, err = f.store.Attempts(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptStale, attempts[0].Outcome, "the reaper keeps the attempt's row")
	require.Equal(t, got.AvailableAt, attempts[0].RetryAt)
}

// Error texts Postgres cannot hold are made storable rather than failing
// the batch; results it cannot hold are refused before anything is written.
func TestCompleteStoresAnyErrorText(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{{Tenant: "acme", Kind: "k"}, {Tenant: "acme", Kind: "k"}})
	require.NoError(t, err)
	a, b := f.claim(t, "w"), f.claim(t, "w")

	bad := succeeded(a, `{"text":"nul \u0000 here"}`)
	_, err = f.store.Complete(ctx, f.pool, []jobs.Completion{bad, succeeded(b, `{}`)})
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
	require.ErrorContains(t, err, `completions[0].Result`)
	require.ErrorIs(t, bad.Validate(), jobs.ErrInvalidParams)

	failed := jobs.Completion{Lease: jobs.Lease{JobID: a.ID, Fence: a.Fence}, Attempt: 1, Worker: "w",
		Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassPermanent, Error: "model said \x00 and \xff\xfe"}
	res, err := f.store.Complete(ctx, f.pool, []jobs.Completion{failed, succeeded(b, `{}`)})
	require.NoError(t, err)
	require.Equal(t, "model said \uFFFD and \uFFFD", res[0].LastError)
	require.Equal(t, jobs.StateSucceeded, res[1].State)
}

func TestOutputAsResult(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		``:                    ``,
		`{"total":"41.00"}`:   `{"total":"41.00"}`,
		`Sure! Here it is: {`: `"Sure! Here it is: {"`,
		`{"a":"\u0000"}`:      `"{\"a\":\"\\u0000\"}"`,
		"nul\x00 \xff":        "\"nul\uFFFD \uFFFD\"",
		`{"x":1e1000000}`:     `"{\"x\":1e1000000}"`, // valid JSON beyond numeric's range: kept as text
		`"\ud800"`:            `"\"\\ud800\""`,
	} {
		got := jobs.OutputAsResult([]byte(in))
		require.Equal(t, want, string(got), "input %q", in)
	}
}

// FuzzOutputAsResult checks that any output becomes JSON the store
// accepts, that JSON the store accepts is kept as it is, and that text
// survives as a JSON string holding it.
//
//	go test -run '^$' -fuzz FuzzOutputAsResult ./jobs
func FuzzOutputAsResult(f *testing.F) {
	for _, seed := range []string{`{"a":1}`, `not json`, `"\u0000"`, "\x00\xff", ``, `[1,2`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, output []byte) {
		got := jobs.OutputAsResult(output)
		if len(output) == 0 {
			require.Empty(t, got)
			return
		}
		c := jobs.Completion{Attempt: 1, Worker: "w", Outcome: jobs.OutcomeReviewRequired, Result: got}
		require.NoError(t, c.Validate(), "%q became %q", output, got)
		if string(got) == string(output) {
			return
		}
		var text string
		require.NoError(t, json.Unmarshal(got, &text))
		require.True(t, utf8.ValidString(text))
		require.NotContains(t, text, "\x00")
		if utf8.Valid(output) && !strings.Contains(string(output), "\x00") {
			require.Equal(t, string(output), text)
		}
	})
}
