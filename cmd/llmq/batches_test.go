package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/providerbatch"
)

// submissionRow is a provider_submissions row a test inserts: the columns
// the batches commands show.
type submissionRow struct {
	pool, model, state       string
	batchID, status, lastErr string
	requests                 int
	succeeded, failed        int
	stale, returned, skipped int
	cancelRequested          bool
	age                      time.Duration // created this long ago
}

// insertSubmission writes s as a submitter would have recorded it, and
// returns its id.
func (f *fixture) insertSubmission(s submissionRow) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	var ended any
	if s.state == "ended" {
		ended = time.Now()
	}
	_, err := f.pool.Exec(f.t.Context(), `INSERT INTO `+f.schema+`.provider_submissions
		(id, pool, provider, model, queue, state, provider_batch_id, provider_status, requests, bytes, estimated_tokens,
		 succeeded, failed, stale, returned, skipped, cancel_requested, polls, last_error, created_at, submitted_at, ended_at)
		VALUES ($1, $2, 'openai', $3, 'extract-batch', $4, nullif($5, ''), nullif($6, ''), $7, $7 * 1000, $7 * 500,
		 $8, $9, $10, $11, $12, $13, 3, nullif($14, ''), now() - $15 * interval '1 second', now() - $15 * interval '1 second', $16)`,
		id, s.pool, s.model, s.state, s.batchID, s.status, s.requests,
		s.succeeded, s.failed, s.stale, s.returned, s.skipped, s.cancelRequested, s.lastErr, s.age.Seconds(), ended)
	require.NoError(f.t, err)
	return id
}

// cancelRequested reads a submission's cancel_requested column.
func (f *fixture) cancelRequested(id uuid.UUID) bool {
	f.t.Helper()
	var requested bool
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), `SELECT cancel_requested FROM `+f.schema+`.provider_submissions WHERE id = $1`, id).Scan(&requested))
	return requested
}

// batches list prints every pool's submissions newest first, as a table
// or as a JSON array, narrowed by --pool and --limit.
func TestBatchesList(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	old := f.insertSubmission(submissionRow{pool: "openai", model: "gpt-4o-mini", state: "submitted", batchID: "batch_old", status: "in_progress",
		requests: 40, succeeded: 10, failed: 2, stale: 1, age: 3 * time.Hour})
	cancelling := f.insertSubmission(submissionRow{pool: "anthropic", model: "claude-haiku", state: "submitted", batchID: "msgbatch_1", status: "in_progress",
		requests: 7, cancelRequested: true, lastErr: "poll: 503 Service Unavailable\nretrying", age: 2 * time.Hour})
	ended := f.insertSubmission(submissionRow{pool: "openai", model: "gpt-4o-mini", state: "ended", batchID: "batch_new", status: "completed",
		requests: 5, succeeded: 3, returned: 1, skipped: 1, age: time.Hour})

	list := func(args ...string) []providerbatch.Submission {
		t.Helper()
		code, out, stderr := f.run(append([]string{"batches", "list", "--json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var subs []providerbatch.Submission
		require.NoError(t, json.Unmarshal([]byte(out), &subs), out)
		return subs
	}
	ids := func(subs []providerbatch.Submission) []uuid.UUID {
		var got []uuid.UUID
		for _, s := range subs {
			got = append(got, s.ID)
		}
		return got
	}
	all := list()
	require.Equal(t, []uuid.UUID{ended, cancelling, old}, ids(all), "every pool's, newest first")
	o := all[2]
	require.Equal(t, "openai", o.Pool)
	require.Equal(t, "openai", o.Provider)
	require.Equal(t, "gpt-4o-mini", o.Model)
	require.Equal(t, "extract-batch", o.Queue)
	require.Equal(t, "submitted", o.State)
	require.Equal(t, "batch_old", o.ProviderBatchID)
	require.Equal(t, "in_progress", o.ProviderStatus)
	require.Equal(t, 40, o.Requests)
	require.Equal(t, int64(40_000), o.Bytes)
	require.Equal(t, int64(20_000), o.EstimatedTokens)
	require.Equal(t, []int{10, 2, 1, 0, 0}, []int{o.Succeeded, o.Failed, o.Stale, o.Returned, o.Skipped})
	require.Equal(t, 3, o.Polls)
	require.False(t, o.CancelRequested)
	require.WithinDuration(t, time.Now().Add(-3*time.Hour), o.CreatedAt, time.Minute)
	require.False(t, o.SubmittedAt.IsZero())
	require.True(t, o.EndedAt.IsZero())
	require.True(t, all[1].CancelRequested)
	require.Equal(t, "poll: 503 Service Unavailable\nretrying", all[1].LastError)
	require.Equal(t, "ended", all[0].State)
	require.Equal(t, []int{3, 0, 0, 1, 1}, []int{all[0].Succeeded, all[0].Failed, all[0].Stale, all[0].Returned, all[0].Skipped})
	require.False(t, all[0].EndedAt.IsZero())

	// The JSON names are the documented ones.
	code, out, _ := f.run("batches", "list", "--json", "--limit", "1")
	require.Equal(t, 0, code)
	var raw []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	require.Len(t, raw, 1)
	for _, key := range []string{"id", "pool", "provider", "model", "queue", "state", "provider_batch_id", "provider_status", "requests", "bytes",
		"estimated_tokens", "succeeded", "failed", "stale", "returned", "skipped", "cancel_requested", "polls", "created_at", "submitted_at", "ended_at"} {
		require.Contains(t, raw[0], key)
	}
	require.Equal(t, ended.String(), raw[0]["id"])

	require.Equal(t, []uuid.UUID{ended, old}, ids(list("--pool", "openai")))
	require.Equal(t, []uuid.UUID{cancelling}, ids(list("-pool", "anthropic")))
	require.Equal(t, []uuid.UUID{ended, cancelling}, ids(list("--limit", "2")))

	code, out, _ = f.run("batches", "list", "--json", "--pool", "nobody")
	require.Equal(t, 0, code)
	require.Equal(t, "[]", strings.TrimSpace(out), "an empty array, not null")

	code, out, stderr := f.run("batches", "list")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^ID +POOL +MODEL +STATE +PROVIDER BATCH +PROVIDER STATUS +REQUESTS +SUCCEEDED +FAILED +STALE +RETURNED +SKIPPED +AGE +CANCEL +ERROR$`, lines[0])
	require.Regexp(t, `^`+ended.String()+` +openai +gpt-4o-mini +ended +batch_new +completed +5 +3 +0 +0 +1 +1 +1h0m[0-9]+s +- *$`, lines[1])
	require.Regexp(t, `^`+cancelling.String()+` +anthropic +claude-haiku +submitted +msgbatch_1 +in_progress +7 +0 +0 +0 +0 +0 +2h0m[0-9]+s +requested +poll: 503 Service Unavailable$`, lines[2],
		"the cancel marker, and the error's first line")
	require.Regexp(t, `^`+old.String()+` +openai +gpt-4o-mini +submitted +batch_old +in_progress +40 +10 +2 +1 +0 +0 +3h0m[0-9]+s +- *$`, lines[3])

	code, out, _ = f.run("batches", "list", "--pool", "nobody")
	require.Equal(t, 0, code)
	require.Contains(t, out, "(no provider batch submissions)")
}

// batches cancel marks an open submission for its submitter to cancel,
// and names the id when no open submission has it.
func TestBatchesCancel(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	open := f.insertSubmission(submissionRow{pool: "openai", model: "gpt-4o-mini", state: "submitted", batchID: "batch_1", status: "in_progress", requests: 3, age: time.Minute})
	preparing := f.insertSubmission(submissionRow{pool: "openai", model: "gpt-4o-mini", state: "preparing", requests: 2, age: time.Minute})
	ended := f.insertSubmission(submissionRow{pool: "openai", model: "gpt-4o-mini", state: "ended", batchID: "batch_0", status: "completed", requests: 3, succeeded: 3, age: time.Hour})

	code, out, stderr := f.run("batches", "cancel", open.String())
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "cancel requested for submission "+open.String()+
		"; the submitter cancels the provider batch at its next poll, and jobs the provider did not answer return to waiting\n", out)
	require.True(t, f.cancelRequested(open))
	code, _, stderr = f.run("batches", "cancel", open.String())
	require.Equal(t, 0, code, "asking again is no error: %s", stderr)

	code, out, stderr = f.run("batches", "cancel", preparing.String(), "--json")
	require.Equal(t, 0, code, stderr)
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, map[string]any{"id": preparing.String(), "cancel_requested": true}, res)
	require.True(t, f.cancelRequested(preparing))

	for _, id := range []uuid.UUID{ended, uuid.New()} {
		code, out, stderr = f.run("batches", "cancel", id.String())
		require.Equal(t, 1, code, "what the database said: %s", stderr)
		require.Empty(t, out)
		require.Contains(t, stderr, "no open submission "+id.String()+": none has that id, or it has ended")
	}
	require.False(t, f.cancelRequested(ended), "an ended submission is left as it was")

	code, out, _ = f.run("batches", "list", "--json", "--pool", "openai")
	require.Equal(t, 0, code)
	var subs []providerbatch.Submission
	require.NoError(t, json.Unmarshal([]byte(out), &subs))
	require.Len(t, subs, 3)
	for _, s := range subs {
		require.Equal(t, s.ID != ended, s.CancelRequested, s.ID)
	}
}

// Refused input exits 2 with a message naming it, before the command
// connects: the database URL leads nowhere, which would exit 1.
func TestBatchesRefusedInput(t *testing.T) {
	t.Parallel()
	nowhere := []string{"-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	id := uuid.NewString()
	for _, bad := range []struct {
		args    []string
		mention string
	}{
		{[]string{"batches", "cancel", "not-a-uuid"}, `batches cancel: "not-a-uuid" is not a submission id (a UUID`},
		{[]string{"batches", "cancel"}, "batches cancel needs a submission id"},
		{[]string{"batches", "cancel", id, id}, `unexpected argument "` + id + `"`},
		{[]string{"batches", "cancel", id, "--frobnicate"}, "flag provided but not defined: -frobnicate"},
		{[]string{"batches", "list", "--limit", "0"}, "batches list: -limit is 0; use 1 to 1000"},
		{[]string{"batches", "list", "--limit", "1001"}, "batches list: -limit is 1001; use 1 to 1000"},
		{[]string{"batches", "list", "--limit", "many"}, `invalid value "many" for flag -limit`},
		{[]string{"batches", "list", "--frobnicate"}, "flag provided but not defined: -frobnicate"},
		{[]string{"batches", "list", "extra"}, `batches list: unexpected argument "extra"`},
		{[]string{"batches", "list", "--pool", "bad\tpool"}, "control character"},
		{[]string{"batches", "list", "-schema", "public"}, "invalid schema name"},
		{[]string{"batches"}, "batches needs list or cancel"},
		{[]string{"batches", "submit"}, `batches "submit": use list or cancel`},
	} {
		code, stdout, stderr := runCLI(t, append(bad.args, nowhere...)...)
		require.Equal(t, 2, code, "%v: %s", bad.args, stderr)
		require.Empty(t, stdout, "%v", bad.args)
		require.Contains(t, stderr, bad.mention, "%v", bad.args)
	}
	// Connecting is what exits 1.
	code, _, stderr := runCLI(t, append([]string{"batches", "cancel", id}, nowhere...)...)
	require.Equal(t, 1, code, stderr)

	// The usage text names the commands, and -h prints a command's flags.
	code, _, stderr = runCLI(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "batches list [--pool P] [--limit N]")
	require.Contains(t, stderr, "batches cancel ID")
	code, _, stderr = runCLI(t, "batches", "list", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "-pool string")
	require.Contains(t, stderr, "-limit int")
}

// On a schema that was never migrated, batches list says how to migrate it.
func TestBatchesUnmigratedSchemaSaysTheFix(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, args := range [][]string{{"batches", "list"}, {"batches", "cancel", uuid.NewString()}} {
		code, _, stderr := c.run(args...)
		require.Equal(t, 1, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "llmq migrate up -schema "+c.schema, args)
	}
}
