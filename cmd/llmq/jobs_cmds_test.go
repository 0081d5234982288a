package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// jobs list pages every tenant's jobs newest first, filtered by tenant,
// state and kind, and the cursor continues where a page ended.
func TestJobsList(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	var ids []string
	for i, p := range []jobs.EnqueueParams{
		{Tenant: "acme", Kind: "invoice.extract"},
		{Tenant: "beta", Kind: "invoice.extract"},
		{Tenant: "acme", Kind: "doc.summarise"},
	} {
		res, err := f.store.Enqueue(ctx, f.pool, p)
		require.NoError(t, err, i)
		ids = append(ids, res.Job.ID.String())
	}
	dead := f.deadJob("beta", "doc.reject").String()

	list := func(args ...string) ([]string, string) {
		t.Helper()
		code, out, stderr := f.run(append([]string{"jobs", "list", "--json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var page struct {
			Jobs       []*jobs.Job `json:"jobs"`
			NextCursor string      `json:"next_cursor"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &page))
		var got []string
		for _, j := range page.Jobs {
			got = append(got, j.ID.String())
		}
		return got, page.NextCursor
	}
	all, next := list()
	require.Equal(t, []string{dead, ids[2], ids[1], ids[0]}, all, "every tenant's, newest first")
	require.Empty(t, next)
	got, _ := list("-tenant", "acme")
	require.Equal(t, []string{ids[2], ids[0]}, got)
	got, _ = list("-state", "failed_terminal")
	require.Equal(t, []string{dead}, got)
	got, _ = list("-kind", "invoice.extract", "-state", "READY,RUNNING")
	require.Equal(t, []string{ids[1], ids[0]}, got)

	first, next := list("-limit", "3")
	require.Equal(t, all[:3], first)
	require.NotEmpty(t, next)
	rest, next := list("-limit", "3", "-cursor", next)
	require.Equal(t, all[3:], rest)
	require.Empty(t, next)

	code, out, _ := f.run("jobs", "list", "-limit", "2")
	require.Equal(t, 0, code)
	require.Contains(t, out, "JOB")
	require.Contains(t, out, "next page: -cursor "+all[1])

	code, _, stderr := f.run("jobs", "list", "-state", "DONE")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `-state "DONE" is not a state; use READY, RUNNING`)
}

// jobs cancel cancels a waiting job by id alone, and says so for one that
// had finished.
func TestJobsCancel(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract"})
	require.NoError(t, err)
	code, out, stderr := f.run("jobs", "cancel", res.Job.ID.String())
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "job "+res.Job.ID.String()+": CANCELLED\n", out)
	job, err := f.store.Get(t.Context(), f.pool, "acme", res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateCancelled, job.State)

	dead := f.deadJob("acme", "doc.reject")
	code, _, stderr = f.run("jobs", "cancel", dead.String())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is FAILED_TERMINAL: it finished before it could be cancelled")

	code, _, stderr = f.run("jobs", "cancel", "not-a-uuid")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "is not a job id")
}

// A usage error is one line naming the problem and one hint, never the
// whole help; a flag error the same, with the command's name.
func TestUsageErrorsAreOneLineAndAHint(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"frobnicate"}, {"jobs"}, {"jobs", "list", "extra"}, {"jobs", "cancel"}} {
		code, _, stderr := runCLI(t, args...)
		require.Equal(t, 2, code, args)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		require.Len(t, lines, 2, "%v: %s", args, stderr)
		require.True(t, strings.HasPrefix(lines[0], "llmq: "), stderr)
		require.Equal(t, usageHint, lines[1])
	}
	code, _, stderr := runCLI(t, "jobs", "list", "-frobnicate")
	require.Equal(t, 2, code)
	require.Equal(t, "flag provided but not defined: -frobnicate\nrun 'llmq jobs list -h' for its flags\n", stderr)
	code, _, stderr = runCLI(t, "jobs", "list", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "-cursor string")
}

// parseStates accepts exactly lists of state names, in any case, and
// refuses anything else as invalid input.
func FuzzParseStates(f *testing.F) {
	for _, seed := range []string{"", "READY", "ready,running", " failed_terminal , CANCELLED", "DONE", ",", "READY,,RUNNING"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, list string) {
		states, err := parseStates(list)
		if err != nil {
			require.ErrorIs(t, err, errInvalidInput)
			return
		}
		if list == "" {
			require.Empty(t, states)
			return
		}
		require.Len(t, states, strings.Count(list, ",")+1)
		for _, st := range states {
			require.True(t, st.Valid(), st)
		}
	})
}

// On a schema that was never migrated, a command says how to migrate it.
func TestUnmigratedSchemaSaysTheFix(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, args := range [][]string{{"jobs", "list"}, {"stats"}, {"jobs", "inspect", "0193a1c4-6e2f-7c4e-9b1a-2d3e4f5a6b7c"}} {
		code, _, stderr := c.run(args...)
		require.Equal(t, 1, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "llmq migrate up -schema "+c.schema, args)
	}
}
