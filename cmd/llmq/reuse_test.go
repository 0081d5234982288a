package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// runReusable enqueues a job of kind for tenant with reuse, claims it and
// completes it as a runner would: with result when its claim found no
// result to reuse, else with the result it took, naming its source. It
// returns the job as it ended.
func (f *fixture) runReusable(tenant, kind string, reuse jobs.Reuse, result string) *jobs.Job {
	f.t.Helper()
	ctx := f.t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: kind, Reuse: &reuse})
	require.NoError(f.t, err)
	job := f.claim(kind)
	require.Equal(f.t, res.Job.ID, job.ID)
	c := jobs.Completion{Lease: jobs.Lease{JobID: job.ID, Fence: job.Fence}, Attempt: job.Attempt, Worker: job.LeaseOwner,
		Outcome: jobs.OutcomeSucceeded, Result: json.RawMessage(result)}
	if job.ReusedFrom != uuid.Nil {
		c.Result, c.ReusedFrom = job.Result, job.ReusedFrom
	}
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(f.t, err)
	require.NoError(f.t, out[0].Err)
	return out[0].Apply(job, c)
}

// countInvalidations is how many invalidations the schema holds.
func (f *fixture) countInvalidations() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), "SELECT count(*) FROM "+f.schema+".job_reuse_invalidations").Scan(&n))
	return n
}

// reuse invalidate records a cut and counts the computed results it
// covers (not reused ones, not another kind's, not outside its key or
// tenant); later claims compute again; reuse list prints the cuts newest
// first, as a table or as a JSON array.
func TestReuseInvalidateAndList(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	k1, k2 := jobs.Reuse{Key: "sha256:k1"}, jobs.Reuse{Key: "sha256:k2"}
	a1 := f.runReusable("acme", "extract", k1, `{"total":1}`)
	f.runReusable("acme", "extract", k2, `{"total":2}`)
	f.runReusable("globex", "extract", k1, `{"total":3}`)
	require.Equal(t, a1.ID, f.runReusable("acme", "extract", k1, `{}`).ReusedFrom, "a reused result, which no invalidation counts")
	f.runReusable("acme", "summarize", k1, `{"summary":"x"}`)

	code, out, stderr := f.run("reuse", "invalidate", "-kind", "extract", "-key", "sha256:k1", "-tenant", "acme",
		"-by", "alice", "-reason", "totals off by one", "--json")
	require.Equal(t, 0, code, stderr)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw), out)
	require.ElementsMatch(t, []string{"id", "kind", "key", "tenant", "at", "by", "reason", "covered"}, keysOf(raw))
	var first invalidationJSON
	require.NoError(t, json.Unmarshal([]byte(out), &first))
	require.Equal(t, jobs.ReuseInvalidation{ID: first.ID, Kind: "extract", Key: "sha256:k1", Tenant: "acme", At: first.At,
		By: "alice", Reason: "totals off by one"}, first.ReuseInvalidation)
	require.Equal(t, int64(1), first.Covered, "acme's one computed result of k1")
	require.Equal(t, uuid.Nil, f.runReusable("acme", "extract", k1, `{"total":1}`).ReusedFrom, "acme's k1 computes again")

	// Every key of the kind, every tenant's: the four computed results
	// of extract, the one computed after the first cut among them.
	code, out, stderr = f.run("reuse", "invalidate", "-kind", "extract", "--by", "bob", "--reason", "new model")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	require.Regexp(t, `^ID +AT +KIND +KEY +TENANT +BY +REASON$`, lines[0])
	require.Regexp(t, `^[0-9]+ +\S+Z +extract +every key +every tenant +bob +new model$`, lines[1])
	require.Equal(t, "computed results covered: 4 (finished in the last 366 days, the longest TTL); no claim reuses them again, "+
		"nor the result of an attempt running now; results of attempts that start later are reused as before", lines[2])

	list := func(args ...string) []jobs.ReuseInvalidation {
		t.Helper()
		code, out, stderr := f.run(append([]string{"reuse", "list", "--json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var got []jobs.ReuseInvalidation
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		return got
	}
	all := list()
	require.Len(t, all, 2)
	require.Equal(t, "bob", all[0].By, "newest first")
	require.Empty(t, all[0].Key)
	require.Empty(t, all[0].Tenant)
	require.Equal(t, first.ReuseInvalidation, all[1])
	require.Equal(t, all[:1], list("-limit", "1"))
	require.Equal(t, all, list("-kind", "extract"))

	code, out, stderr = f.run("reuse", "list")
	require.Equal(t, 0, code, stderr)
	lines = strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	require.Regexp(t, `^ID +AT +KIND +KEY +TENANT +BY +REASON$`, lines[0])
	require.Regexp(t, `^[0-9]+ +\S+Z +extract +every key +every tenant +bob +new model$`, lines[1])
	require.Regexp(t, `^[0-9]+ +\S+Z +extract +sha256:k1 +acme +alice +totals off by one$`, lines[2])

	code, out, _ = f.run("reuse", "list", "-kind", "summarize", "--json")
	require.Equal(t, 0, code)
	require.Equal(t, "[]", strings.TrimSpace(out), "an empty array, not null")
	code, out, _ = f.run("reuse", "list", "-kind", "summarize")
	require.Equal(t, 0, code)
	require.Contains(t, out, "(no reuse invalidations)")
}

func keysOf(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// Refused input exits 2 with a message naming the flag, and records
// nothing: what is missing is refused before connecting, what the store
// refuses is named by its flag.
func TestReuseRefusedInput(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	invalidate := func(args ...string) []string { return append([]string{"reuse", "invalidate"}, args...) }
	for _, bad := range []struct {
		args     []string
		mentions []string
	}{
		{invalidate("-by", "alice", "-reason", "why"), []string{"reuse invalidate: -kind K is required", usageHint}},
		{invalidate("-kind", "extract", "-by", "alice"), []string{"reuse invalidate: -reason WHY is required"}},
		{invalidate("-kind", "extract", "-by", "alice", "-reason", "  "), []string{"-reason WHY is required"}},
		{invalidate("-kind", "extract", "-reason", "why"), []string{"reuse invalidate: -by WHO is required"}},
		{invalidate("-kind", "Bad Kind!", "-by", "alice", "-reason", "why"), []string{`reuse invalidate: -kind "Bad Kind!": use letters, digits`}},
		{invalidate("-kind", "extract", "-key", "a\tb", "-by", "alice", "-reason", "why"), []string{"reuse invalidate: -key contains a control character"}},
		{invalidate("-kind", "extract", "-key", "", "-by", "alice", "-reason", "why"), []string{"-key is empty; leave it out to invalidate every key"}},
		{invalidate("-kind", "extract", "-tenant", "", "-by", "alice", "-reason", "why"), []string{"-tenant is empty"}},
		{invalidate("-kind", "extract", "-tenant", "bad\x01", "-by", "alice", "-reason", "why"), []string{"-tenant", "control character"}},
		{invalidate("-kind", "extract", "-by", "alice", "-reason", strings.Repeat("r", 1001)), []string{"reuse invalidate: -reason is 1001 bytes"}},
		{invalidate("-kind", "extract", "-by", "alice", "-reason", "why", "extra"), []string{`unexpected argument "extra"`}},
		{invalidate("-kind", "extract", "-by", "alice", "-reason", "why", "-frobnicate"), []string{"flag provided but not defined: -frobnicate"}},
		{[]string{"reuse", "list", "-limit", "0"}, []string{"reuse list: -limit is 0; use 1 to"}},
		{[]string{"reuse"}, []string{"reuse needs invalidate or list"}},
		{[]string{"reuse", "purge"}, []string{`reuse "purge": use invalidate or list`}},
	} {
		f.refused(2, bad.args, bad.mentions...)
	}
	require.Zero(t, f.countInvalidations(), "nothing was recorded")

	// The usage text names the commands, and -h prints a command's flags.
	code, _, stderr := runCLI(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "reuse invalidate -kind K [-key KEY] [-tenant T] -by WHO -reason WHY")
	require.Contains(t, stderr, "reuse list [-kind K] [-limit N]")
	code, _, stderr = runCLI(t, "reuse", "invalidate", "-h")
	require.Equal(t, 0, code)
	for _, flag := range []string{"-kind string", "-key string", "-tenant string", "-by string", "-reason string"} {
		require.Contains(t, stderr, flag)
	}
}

// On a schema that was never migrated, the reuse commands say how to
// migrate it.
func TestReuseUnmigratedSchemaSaysTheFix(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, args := range [][]string{{"reuse", "list"}, {"reuse", "invalidate", "-kind", "extract", "-by", "alice", "-reason", "why"}} {
		code, _, stderr := c.run(args...)
		require.Equal(t, 1, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "llmq migrate up -schema "+c.schema, args)
	}
}
