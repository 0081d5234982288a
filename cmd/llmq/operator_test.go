package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// fixture is a migrated schema with a job store and a pool on it, to set
// up data for the commands and to read what they wrote.
type fixture struct {
	*cli
	store *jobs.PostgresStore
	pool  *pgxpool.Pool
}

func setupMigrated(t *testing.T) *fixture {
	t.Helper()
	c := setup(t)
	store, pool := c.migrated()
	return &fixture{cli: c, store: store, pool: pool}
}

// deadJob enqueues a job of kind for tenant, runs one attempt of it that
// fails permanently, and returns its id: a dead letter with one attempt.
func (f *fixture) deadJob(tenant, kind string) uuid.UUID {
	f.t.Helper()
	ctx := f.t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: kind, Payload: json.RawMessage(`{"doc":"inv-1"}`)})
	require.NoError(f.t, err)
	job := f.claim(kind)
	require.Equal(f.t, res.Job.ID, job.ID)
	// The attempt stored one durable step before its call failed.
	_, err = f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: jobs.Lease{JobID: job.ID, Fence: job.Fence},
		Name: "ocr", Output: json.RawMessage(`{"text":"INVOICE"}`), Usage: jobs.Usage{InputTokens: 90, OutputTokens: 5}})
	require.NoError(f.t, err)
	_, err = f.store.Complete(ctx, f.pool, []jobs.Completion{{
		Lease: jobs.Lease{JobID: job.ID, Fence: job.Fence}, Attempt: job.Attempt, Worker: "w1",
		Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassPermanent, Error: "400: bad document",
		Usage: jobs.Usage{InputTokens: 120, OutputTokens: 7},
	}})
	require.NoError(f.t, err)
	return res.Job.ID
}

// claim claims the one eligible job of kind. A claim serves the tenant
// with the lowest virtual time first, and one that has no job of kind comes
// up empty (marking that tenant idle), so it may take a claim per tenant.
func (f *fixture) claim(kind string) *jobs.Job {
	f.t.Helper()
	for range 10 {
		claimed, err := f.store.Claim(f.t.Context(), f.pool, jobs.ClaimParams{
			Queue: jobs.DefaultQueue, Kinds: []string{kind}, Worker: "w1", Limit: 1, LeaseDuration: time.Minute})
		require.NoError(f.t, err)
		if len(claimed) == 1 {
			return claimed[0]
		}
	}
	require.FailNow(f.t, "no job of kind "+kind+" could be claimed")
	return nil
}

// snapshot is the content of every table an operator command may write,
// to prove that a refused command wrote nothing.
func (f *fixture) snapshot() string {
	f.t.Helper()
	var b strings.Builder
	for _, table := range []string{"jobs", "job_attempts", "outbox", "tenant_limits", "admission_tenant_quotas", "admission_pools"} {
		var rows string
		err := f.pool.QueryRow(f.t.Context(), "SELECT coalesce(string_agg(to_jsonb(t)::text, E'\\n' ORDER BY to_jsonb(t)::text), '') FROM "+
			f.schema+"."+table+" AS t").Scan(&rows)
		require.NoError(f.t, err)
		b.WriteString(table + ":\n" + rows + "\n")
	}
	return b.String()
}

// refused runs args, expects exit code want and a message containing
// each of mentions, and proves nothing was written.
func (f *fixture) refused(want int, args []string, mentions ...string) {
	f.t.Helper()
	before := f.snapshot()
	code, stdout, stderr := f.run(args...)
	require.Equal(f.t, want, code, "%v: %s", args, stderr)
	require.Empty(f.t, stdout, "%v", args)
	for _, m := range mentions {
		require.Contains(f.t, stderr, m, "%v", args)
	}
	require.Equal(f.t, before, f.snapshot(), "%v wrote nothing", args)
}

func TestStatsReport(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	for range 2 {
		_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
		require.NoError(t, err)
	}
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "globex", Kind: "k", AvailableAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "globex", Kind: "slow"})
	require.NoError(t, err)
	f.claim("slow")
	require.NoError(t, f.store.SetTenantLimits(ctx, f.pool, "acme", jobs.TenantLimits{Weight: 3, MaxRunning: 5}))

	code, out, stderr := f.run("stats", "--json")
	require.Equal(t, 0, code, stderr)
	var report statsReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Len(t, report.Queues, 1)
	require.Equal(t, map[jobs.State]int64{jobs.StateReady: 3, jobs.StateRunning: 1}, report.Queues[0].Counts)
	require.Positive(t, report.Queues[0].OldestEligibleAgeSeconds)
	require.Equal(t, int64(4), report.Outbox.Unpublished, "one requested event per job, no relay ran")
	require.Positive(t, report.Outbox.OldestUnpublishedAgeSeconds)
	require.Len(t, report.Tenants, 2)
	acme, globex := report.Tenants[0], report.Tenants[1]
	require.Equal(t, backlogJSON{Queue: "default", Tenant: "acme", Runnable: 2, Weight: 3, MaxInFlight: 5, OwnLimits: true,
		OldestRunnableAgeSeconds: acme.OldestRunnableAgeSeconds}, acme)
	require.Positive(t, acme.OldestRunnableAgeSeconds)
	require.Equal(t, backlogJSON{Queue: "default", Tenant: "globex", Scheduled: 1, InFlight: 1, Weight: 1}, globex,
		"the scheduled job is not runnable; the defaults apply")
	require.Len(t, report.Kinds, 2)
	k, slow := report.Kinds[0], report.Kinds[1]
	require.Positive(t, k.OldestRunnableAgeSeconds)
	require.Equal(t, kindJSON{Queue: "default", Kind: "k", Runnable: 2, Scheduled: 1, OldestRunnableAgeSeconds: k.OldestRunnableAgeSeconds}, k)
	require.Equal(t, kindJSON{Queue: "default", Kind: "slow", InFlight: 1}, slow)

	code, out, stderr = f.run("stats")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `default\s+3\s+1\s+0\s+0\s+0\s+0\s+0\s+\S+`, out)
	require.Contains(t, out, "outbox: 4 unpublished, oldest ")
	require.Regexp(t, `default\s+acme\s+2\s+0\s+0\s+\S+\s+3\s+5\s`, out)
	require.Regexp(t, `default\s+globex\s+0\s+1\s+1\s+-\s+1 \(default\)\s+- \(default\)`, out)
	require.Regexp(t, `QUEUE\s+KIND\s+RUNNABLE\s+SCHEDULED\s+IN FLIGHT\s+OLDEST RUNNABLE\n`, out)
	require.Regexp(t, `default\s+k\s+2\s+1\s+0\s+\S+\n`, out)
	require.Regexp(t, `default\s+slow\s+0\s+0\s+1\s+-\n`, out)
}

func TestJobsInspect(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	id := f.deadJob("acme", "extract").String()

	// The documented form finds the job by id alone, flags after the id.
	code, out, stderr := f.run("jobs", "inspect", id)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "tenant        acme")
	require.Contains(t, out, "FAILED_TERMINAL")
	require.Contains(t, out, "[permanent] 400: bad document")
	require.Regexp(t, `(?m)^1\s+w1\s+\S+\s+\S+\s+failed\s+permanent\s+-\s+120/7\s+false\s+400: bad document`, out, "the attempt and its outcome")
	require.Regexp(t, `(?m)^ocr\s+1\s+-\s+90/5\s+\S+`, out, "the step the attempt stored")
	require.Contains(t, out, "extract.requested")
	require.Contains(t, out, "extract.dead_lettered")

	code, out, stderr = f.run("jobs", "inspect", id, "--json")
	require.Equal(t, 0, code, stderr)
	var got struct {
		Job      jobs.Job       `json:"job"`
		Attempts []jobs.Attempt `json:"attempts"`
		Steps    []jobs.Step    `json:"steps"`
		Events   []struct {
			Type string `json:"type"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, jobs.StateFailedTerminal, got.Job.State)
	require.Len(t, got.Attempts, 1)
	require.Equal(t, jobs.AttemptOutcome("failed"), got.Attempts[0].Outcome)
	require.Len(t, got.Steps, 1)
	require.JSONEq(t, `{"text":"INVOICE"}`, string(got.Steps[0].Output))
	require.Len(t, got.Events, 2)
	require.Equal(t, "extract.dead_lettered", got.Events[1].Type)

	// The older form, and -tenant as a scope.
	code, out, stderr = f.runCommand([]string{"inspect"}, "-tenant", "acme", id)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "FAILED_TERMINAL")
	code, _, stderr = f.run("jobs", "inspect", id, "-tenant", "globex")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "not found", "-tenant scopes the search")

	code, _, stderr = f.run("jobs", "inspect", uuid.NewString())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "job not found")
	for _, bad := range []struct {
		args    []string
		mention string
	}{
		{[]string{"jobs", "inspect"}, "jobs inspect needs a job id"},
		{[]string{"jobs", "inspect", "inv-42"}, `"inv-42" is not a job id`},
		{[]string{"jobs", "inspect", id, id}, "unexpected argument"},
		{[]string{"jobs", "show"}, `jobs "show": use list or inspect or cancel`},
		{[]string{"jobs"}, "jobs needs list or inspect or cancel"},
	} {
		code, _, stderr := f.run(bad.args...)
		require.Equal(t, 2, code, bad.args)
		require.Contains(t, stderr, bad.mention)
	}
}

// jobs inspect shows a job's reuse key, scope and TTL, the job whose result
// it took, and the attempt that took it naming its source; --json carries
// them in the job's and the attempt's fields.
// inspect names the candidate that served each routed attempt, with its
// model, and lists the calls that moved on before it.
func TestJobsInspectShowsRoute(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	id := f.routedAttempt("acme", "extract", jobs.OutcomeSucceeded, "anthropic-eu", "claude-sonnet", jobs.Usage{InputTokens: 900, OutputTokens: 60},
		jobs.Move{Candidate: "openai-us", Model: "gpt-large", Failure: "rate_limited", Error: "429 Too Many Requests", Uncertain: true})
	code, out, stderr := f.run("jobs", "inspect", id.String())
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^1\s+w1\s+\S+\s+\S+\s+succeeded\s+anthropic-eu \(claude-sonnet\)\s+900/60\s+false\s*$`, out)
	require.Regexp(t, `(?m)^\s+moved on from\s+rate_limited\s+openai-us \(gpt-large\)\s+0/0\s+true\s+429 Too Many Requests$`, out)

	code, out, stderr = f.run("jobs", "inspect", id.String(), "--json")
	require.Equal(t, 0, code, stderr)
	var got struct {
		Attempts []jobs.Attempt `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, "anthropic-eu", got.Attempts[0].Candidate)
	require.Equal(t, []jobs.Move{{Candidate: "openai-us", Model: "gpt-large", Failure: "rate_limited", Error: "429 Too Many Requests", Uncertain: true}}, got.Attempts[0].Moves)
}

func TestJobsInspectShowsReuse(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	key := jobs.Reuse{Key: "sha256:doc-1"}
	source := f.runReusable("acme", "extract", key, `{"total":42}`)
	taker := f.runReusable("acme", "extract", key, `{}`)
	require.Equal(t, source.ID, taker.ReusedFrom)
	shared := f.runReusable("globex", "extract", jobs.Reuse{Key: "sha256:public", Shared: true, TTL: 2 * time.Hour}, `{}`)

	code, out, stderr := f.run("jobs", "inspect", source.ID.String())
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "reuse         sha256:doc-1 (tenant scope, TTL 24h0m0s)\n")
	require.NotContains(t, out, "reused from", "it computed its result")
	require.Regexp(t, `(?m)^1\s+w1\s+\S+\s+\S+\s+succeeded\s+-\s+0/0\s+false\s*$`, out)

	code, out, stderr = f.run("jobs", "inspect", taker.ID.String())
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "reuse         sha256:doc-1 (tenant scope, TTL 24h0m0s)\n")
	require.Contains(t, out, "reused from   "+source.ID.String()+" (its result, the handler not called)\n")
	require.Regexp(t, `(?m)^1\s+w1\s+\S+\s+\S+\s+reused from `+source.ID.String()+`\s+-\s+0/0\s+false\s*$`, out)
	require.Contains(t, out, "extract.completed", "the events of a computed success")

	code, out, stderr = f.run("jobs", "inspect", shared.ID.String())
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "reuse         sha256:public (shared scope, TTL 2h0m0s)\n")

	code, out, stderr = f.run("jobs", "inspect", taker.ID.String(), "--json")
	require.Equal(t, 0, code, stderr)
	var got struct {
		Job      jobs.Job       `json:"job"`
		Attempts []jobs.Attempt `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, &jobs.Reuse{Key: "sha256:doc-1", TTL: jobs.DefaultReuseTTL}, got.Job.Reuse)
	require.Equal(t, source.ID, got.Job.ReusedFrom)
	require.JSONEq(t, `{"total":42}`, string(got.Job.Result))
	require.Len(t, got.Attempts, 1)
	require.Equal(t, jobs.AttemptReused, got.Attempts[0].Outcome)
	require.Equal(t, source.ID, got.Attempts[0].ReusedFrom)
	var raw struct {
		Job      map[string]any   `json:"job"`
		Attempts []map[string]any `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	require.Equal(t, map[string]any{"key": "sha256:doc-1", "ttl": float64(jobs.DefaultReuseTTL)}, raw.Job["reuse"])
	require.Equal(t, source.ID.String(), raw.Job["reused_from"])
	require.Equal(t, source.ID.String(), raw.Attempts[0]["reused_from"])
}

func TestDeadListAndReplay(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	acmeID := f.deadJob("acme", "extract")
	globexID := f.deadJob("globex", "extract")

	code, out, stderr := f.run("dead", "list")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, globexID.String()+`\s+globex\s+extract\s+default\s+1\s+\S+\s+permanent\s+400: bad document`, out)
	require.Contains(t, out, acmeID.String())

	for _, command := range []string{"dead", "dead-letter"} {
		code, out, stderr = f.run(command, "list", "-tenant", "acme", "--json")
		require.Equal(t, 0, code, stderr)
		var dead []jobs.Job
		require.NoError(t, json.Unmarshal([]byte(out), &dead))
		require.Len(t, dead, 1, command)
		require.Equal(t, acmeID, dead[0].ID)
	}
	code, out, _ = f.run("dead", "list", "-tenant", "initech", "--json")
	require.Equal(t, 0, code)
	require.JSONEq(t, "[]", out)

	// Replay records who and why on a new job and leaves the dead one,
	// its attempts and its events as they were.
	before := f.rowsOf(acmeID)
	code, out, stderr = f.run("dead", "replay", acmeID.String(), "--reason", "parser fixed in 1.4", "--by", "alice", "--json")
	require.Equal(t, 0, code, stderr)
	var replay jobs.Job
	require.NoError(t, json.Unmarshal([]byte(out), &replay))
	require.Equal(t, acmeID, replay.ReplayOf)
	require.Equal(t, "alice", replay.ReplayedBy)
	require.Equal(t, "parser fixed in 1.4", replay.ReplayReason)
	require.Equal(t, jobs.StateReady, replay.State)
	require.Equal(t, "acme", replay.Tenant)
	require.JSONEq(t, `{"doc":"inv-1"}`, string(replay.Payload))
	require.Equal(t, before, f.rowsOf(acmeID), "the dead job is unchanged")
	stored, err := f.store.Get(ctx, f.pool, "acme", replay.ID)
	require.NoError(t, err)
	require.Equal(t, "alice", stored.ReplayedBy)

	// The older name, with --by defaulting to the OS user.
	who, err := osUser()
	require.NoError(t, err)
	code, out, stderr = f.run("dead-letter", "replay", globexID.String(), "-reason", "retry after outage")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, "^replayed "+globexID.String()+` as \S+ \(READY\), by `+who+": retry after outage\n$", out)

	// A second replay (a double click) returns the first one and writes
	// nothing; --again asks for another job.
	jobsBefore := f.countJobs()
	code, out, stderr = f.run("dead", "replay", acmeID.String(), "--reason", "clicked twice", "--by", "bob")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, acmeID.String()+" was already replayed as "+replay.ID.String()+
		" (READY), by alice: parser fixed in 1.4; nothing was written (--again replays it once more)\n", out)
	code, out, stderr = f.run("dead", "replay", acmeID.String(), "--reason", "clicked twice", "--json")
	require.Equal(t, 0, code, stderr)
	var existing struct {
		jobs.Job
		Existing bool `json:"existing"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &existing))
	require.True(t, existing.Existing)
	require.Equal(t, replay.ID, existing.ID)
	require.Equal(t, jobsBefore, f.countJobs())
	code, out, stderr = f.run("dead", "replay", acmeID.String(), "--reason", "second run wanted", "--by", "bob", "--again")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, "^replayed "+acmeID.String()+` as \S+ \(READY\), by bob: second run wanted\n$`, out)
	require.NotContains(t, out, replay.ID.String())
	require.Equal(t, jobsBefore+1, f.countJobs())

	replayed := replay.ID.String()
	for _, bad := range []struct {
		code     int
		args     []string
		mentions []string
	}{
		{2, []string{"dead", "replay", acmeID.String()}, []string{"--reason WHY is required"}},
		{2, []string{"dead", "replay", acmeID.String(), "--reason", "  "}, []string{"--reason WHY is required"}},
		{2, []string{"dead", "replay", "--reason", "x"}, []string{"replay needs a job id"}},
		{2, []string{"dead", "replay", "42", "--reason", "x"}, []string{`"42" is not a job id`}},
		{2, []string{"dead", "replay", acmeID.String(), "--reason", "x", "--deadline", "-1h"}, []string{"-deadline is -1h0m0s"}},
		{2, []string{"dead", "replay", acmeID.String(), "--reason", "x", "--bogus"}, []string{"flag provided but not defined: -bogus"}},
		{2, []string{"dead", "purge"}, []string{`dead "purge": use list or replay`}},
		{2, []string{"dead", "list", "-limit", "0"}, []string{"-limit is 0"}},
		{1, []string{"dead", "replay", uuid.NewString(), "--reason", "x"}, []string{"job not found"}},
		{1, []string{"dead", "replay", acmeID.String(), "--reason", "x", "-tenant", "globex"}, []string{"job not found"}},
		{1, []string{"dead", "replay", replayed, "--reason", "x"}, []string{"cannot be replayed", "READY"}},
	} {
		f.refused(bad.code, bad.args, bad.mentions...)
	}
}

// countJobs is how many jobs the schema holds.
func (f *fixture) countJobs() int {
	f.t.Helper()
	var n int
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), "SELECT count(*) FROM "+f.schema+".jobs").Scan(&n))
	return n
}

// rowsOf is a job's row, attempts and events as stored.
func (f *fixture) rowsOf(id uuid.UUID) string {
	f.t.Helper()
	var job, attempts, events string
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), "SELECT to_jsonb(j)::text FROM "+f.schema+".jobs AS j WHERE id = $1", id).Scan(&job))
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), "SELECT coalesce(string_agg(to_jsonb(a)::text, ',' ORDER BY attempt), '') FROM "+
		f.schema+".job_attempts AS a WHERE job_id = $1", id).Scan(&attempts))
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(), "SELECT coalesce(string_agg(to_jsonb(o)::text, ',' ORDER BY seq), '') FROM "+
		dbtest.OutboxEvents(f.schema, "o")+" WHERE aggregate_id = $1", id).Scan(&events))
	return job + "\n" + attempts + "\n" + events
}

func TestTenantsCommands(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	quotas, err := admission.NewQuotas(admission.QuotaConfig{Schema: f.schema})
	require.NoError(t, err)

	code, out, stderr := f.run("tenants", "list")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `\(defaults\)\s+1\s+-\s+\(config\)`, out)

	// Flags before the tenant, then after it.
	code, out, stderr = f.runCommand([]string{"tenants", "set"}, "--weight", "3", "acme", "--max-in-flight", "5", "--max-pending-jobs", "100")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `acme\s+3\s+5\s+100\s+-\s+-\s+-`, out)
	limits, err := f.store.TenantLimitsOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 3, MaxRunning: 5}, limits)
	quota, own, err := quotas.TenantQuotaOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.True(t, own)
	require.Equal(t, admission.TenantQuota{MaxPendingJobs: 100}, quota)

	// Setting some limits keeps the others.
	code, out, stderr = f.run("tenants", "set", "acme", "--max-daily-cost", "2500000", "--max-pending-bytes", "1048576", "--json")
	require.Equal(t, 0, code, stderr)
	var rows []tenantRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Equal(t, []tenantRow{{Tenant: "acme", Weight: 3, MaxInFlight: 5, OwnLimits: true,
		Quota: &admission.TenantQuota{MaxPendingJobs: 100, MaxPendingBytes: 1 << 20, MaxDailyCost: 2_500_000}}}, rows)
	code, _, stderr = f.run("tenants", "set", "acme", "--weight", "2")
	require.Equal(t, 0, code, stderr)
	quota, _, err = quotas.TenantQuotaOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.Equal(t, admission.TenantQuota{MaxPendingJobs: 100, MaxPendingBytes: 1 << 20, MaxDailyCost: 2_500_000}, quota)

	// A quota alone writes no limits: the tenant keeps following the
	// defaults.
	code, _, stderr = f.run("tenants", "set", "globex", "--max-pending-tokens", "50000")
	require.Equal(t, 0, code, stderr)
	code, out, stderr = f.run("tenants", "list", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Equal(t, []tenantRow{
		{Tenant: "", Weight: 1, OwnLimits: true},
		{Tenant: "acme", Weight: 2, MaxInFlight: 5, OwnLimits: true, Quota: &admission.TenantQuota{MaxPendingJobs: 100, MaxPendingBytes: 1 << 20, MaxDailyCost: 2_500_000}},
		{Tenant: "globex", Weight: 1, Quota: &admission.TenantQuota{MaxPendingTokens: 50_000}},
	}, rows)
	code, out, stderr = f.run("tenants", "list")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `acme\s+2\s+5\s+100\s+1048576\s+-\s+2500000`, out)
	require.Regexp(t, `globex\s+1 \(default\)\s+- \(default\)\s+-\s+-\s+50000\s+-`, out)

	for _, bad := range []struct {
		args     []string
		mentions []string
	}{
		{[]string{"tenants", "set", "acme", "--weight", "0"}, []string{"--weight is 0; use 1 to 1000"}},
		{[]string{"tenants", "set", "acme", "--weight", "1001"}, []string{"--weight is 1001"}},
		{[]string{"tenants", "set", "acme", "--weight", "-2"}, []string{`invalid value "-2" for flag -weight: must not be negative`}},
		{[]string{"tenants", "set", "acme", "--max-in-flight", "-1"}, []string{"-max-in-flight: must not be negative"}},
		{[]string{"tenants", "set", "acme", "--max-pending-jobs", "lots"}, []string{"-max-pending-jobs: not a whole number"}},
		{[]string{"tenants", "set", "acme", "--max-daily-cost", "-5"}, []string{"-max-daily-cost: must not be negative"}},
		{[]string{"tenants", "set", "acme"}, []string{"give at least one of --weight"}},
		{[]string{"tenants", "set", "--weight", "2"}, []string{"tenants set needs a tenant"}},
		{[]string{"tenants", "set", "acme", "globex", "--weight", "2"}, []string{`unexpected argument "globex"`}},
		{[]string{"tenants", "set", "acme", "--quota", "5"}, []string{"flag provided but not defined: -quota"}},
		{[]string{"tenants", "set", "", "--weight", "5"}, []string{"the tenant must not be empty"}},
		{[]string{"tenants", "reset"}, []string{"tenants reset needs a tenant"}},
		{[]string{"tenants", "reset", ""}, []string{"the tenant must not be empty"}},
		{[]string{"tenants", "delete", "acme"}, []string{`tenants "delete": use list or set or reset`}},
	} {
		f.refused(2, bad.args, bad.mentions...)
	}
	f.refused(2, []string{"tenants", "set", strings.Repeat("x", 201), "--weight", "2"}, "tenant", "more than the limit of 200")
	f.refused(2, []string{"tenants", "set", "bad\tname", "--max-pending-jobs", "2"}, "control character")

	// The defaults' weight and cap reach every tenant without its own.
	code, out, stderr = f.run("tenants", "set", "--defaults", "--max-in-flight", "8")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `\(defaults\)\s+1\s+8\s`, out)
	limits, err = f.store.TenantLimitsOf(ctx, f.pool, "globex")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 1, MaxRunning: 8}, limits)
	f.refused(2, []string{"tenants", "set", "--defaults", "acme", "--weight", "2"}, `unexpected argument "acme"`)
	f.refused(2, []string{"tenants", "set", "--defaults", "--max-pending-jobs", "2"}, "the default quota is the host's QuotaConfig.Default")

	// Reset drops both; the defaults apply again.
	code, out, stderr = f.run("tenants", "reset", "acme", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Equal(t, []tenantRow{{Tenant: "acme", Weight: 1, MaxInFlight: 8}}, rows)
	_, own, err = quotas.TenantQuotaOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.False(t, own)
	limits, err = f.store.TenantLimitsOf(ctx, f.pool, "acme")
	require.NoError(t, err)
	require.Equal(t, jobs.TenantLimits{Weight: 1, MaxRunning: 8}, limits)
}

func TestPoolsCommands(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	limiter, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)

	code, out, stderr := f.run("pools", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "(no pools)")

	code, out, stderr = f.run("pools", "set", "gpt-4o", "--create", "--rpm", "600", "--tpm", "100000", "--in-flight", "10", "--input-price", "2500000")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `gpt-4o\s+600\s+100000\s+0/10\s+0/-\s+10/10\s+10000/10000\s+-\s+2500000/0\s+1250000\(half\)/0\(half\)`, out)

	// Usage shows: a held permit and a provider's cooldown.
	permit, err := limiter.Acquire(ctx, admission.Request{Pool: "gpt-4o", Tenant: "acme", Tokens: 1000})
	require.NoError(t, err)
	require.NoError(t, limiter.Cooldown(ctx, "gpt-4o", time.Minute))
	code, out, stderr = f.run("pools", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var rows []poolRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 1)
	require.Equal(t, 1, rows[0].InFlight)
	require.Greater(t, rows[0].CooldownSeconds, 50.0)
	code, out, _ = f.run("pools", "list")
	require.Equal(t, 0, code)
	require.Regexp(t, `gpt-4o\s+600\s+100000\s+1/10\s+1000/-\s+\d+/10\s+\d+/10000\s+(59|1m0)s\s+2500000/0\s+1250000\(half\)/0\(half\)`, out)

	// Setting some limits keeps the others; a burst left at its default
	// follows the new rate.
	code, out, stderr = f.run("pools", "set", "gpt-4o", "--rpm", "1200", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Equal(t, admission.Pool{Name: "gpt-4o", RPM: 1200, TPM: 100_000, MaxInFlight: 10, RequestBurst: 20, TokenBurst: 10_000, InputPrice: 2_500_000}, rows[0].Pool)
	code, _, stderr = f.runCommand([]string{"pools", "set"}, "--token-burst", "4000", "gpt-4o", "--in-flight", "4")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = f.run("pools", "set", "gpt-4o", "--tpm", "200000", "--refund-uncertain", "--in-flight-tokens", "64000")
	require.Equal(t, 0, code, stderr)
	state, err := limiter.State(ctx, "gpt-4o")
	require.NoError(t, err)
	require.Equal(t, admission.Pool{Name: "gpt-4o", RPM: 1200, TPM: 200_000, MaxInFlight: 4, MaxInFlightTokens: 64_000, RequestBurst: 20, TokenBurst: 4000,
		InputPrice: 2_500_000, RefundUncertain: true}, state.Pool, "the burst set on purpose stays")

	// A batch price set on purpose is shown as it is.
	code, out, stderr = f.run("pools", "set", "gpt-4o", "--batch-input-price", "1000000")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `\s2500000/0\s+1000000/0\(half\)\n`, out)
	state, err = limiter.State(ctx, "gpt-4o")
	require.NoError(t, err)
	require.Equal(t, int64(1_000_000), state.BatchInputPrice)
	require.Zero(t, state.BatchOutputPrice)
	code, _, stderr = f.run("pools", "set", "gpt-4o", "--batch-output-price", "-1")
	require.Equal(t, 2, code, "a negative price is refused: %s", stderr)
	require.Equal(t, int64(1000), state.InFlightTokens, "the held permit's reservation counts")
	require.Equal(t, 1, state.InFlight, "the held permit still counts")
	require.NoError(t, permit.Release(ctx, admission.CallOutcome{Result: admission.CallNotSent}))

	for _, bad := range []struct {
		code     int
		args     []string
		mentions []string
	}{
		{2, []string{"pools", "set", "gpt-5", "--rpm", "100"}, []string{`unknown pool "gpt-5"`, "--create"}},
		{2, []string{"pools", "set", "gpt-5", "--create", "--rpm", "100"}, []string{"a new pool needs --rpm, --tpm and --in-flight"}},
		{2, []string{"pools", "set", "gpt-4o", "--rpm", "0"}, []string{"--rpm must be positive"}},
		{2, []string{"pools", "set", "gpt-4o", "--in-flight", "0"}, []string{"--in-flight must be positive"}},
		{2, []string{"pools", "set", "gpt-4o", "--tpm", "-5"}, []string{`invalid value "-5" for flag -tpm: must not be negative`}},
		{2, []string{"pools", "set", "gpt-4o", "--rpm", "3000000000"}, []string{"--rpm is 3000000000"}},
		{2, []string{"pools", "set", "gpt-4o", "--in-flight", "ten"}, []string{"-in-flight: not a whole number"}},
		{2, []string{"pools", "set", "gpt-4o"}, []string{"give at least one of --rpm"}},
		{2, []string{"pools", "set", "--rpm", "5"}, []string{"pools set needs a pool"}},
		{2, []string{"pools", "set", "gpt-4o", "--rps", "5"}, []string{"flag provided but not defined: -rps"}},
		{2, []string{"pools", "drop", "gpt-4o"}, []string{`pools "drop": use list or set`}},
		{2, []string{"pools", "list", "gpt-4o"}, []string{`unexpected argument "gpt-4o"`}},
	} {
		f.refused(bad.code, bad.args, bad.mentions...)
	}
}

// Two operators changing different limits of one pool at the same moment:
// both changes survive, round after round.
func TestConcurrentPoolEditsAreNotLost(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	limiter, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)
	code, _, stderr := f.run("pools", "set", "p", "--create", "--rpm", "600", "--tpm", "100000", "--in-flight", "10")
	require.Equal(t, 0, code, stderr)
	for round := 1; round <= 5; round++ {
		input, output := strconv.Itoa(1000*round), strconv.Itoa(2000*round)
		var wg sync.WaitGroup
		codes := make([]int, 2)
		wg.Go(func() { codes[0], _, _ = f.run("pools", "set", "p", "--input-price", input) })
		wg.Go(func() { codes[1], _, _ = f.run("pools", "set", "p", "--output-price", output) })
		wg.Wait()
		require.Equal(t, []int{0, 0}, codes)
		state, err := limiter.State(t.Context(), "p")
		require.NoError(t, err)
		require.Equal(t, int64(1000*round), state.InputPrice, "round %d", round)
		require.Equal(t, int64(2000*round), state.OutputPrice, "round %d", round)
	}
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		pos  []string
		by   string
	}{
		{[]string{"ID", "--by", "ops"}, []string{"ID"}, "ops"},
		{[]string{"-by", "ops", "ID"}, []string{"ID"}, "ops"},
		{[]string{"--by=ops", "ID", "OTHER"}, []string{"ID", "OTHER"}, "ops"},
		{[]string{"--by", "ops", "--", "-ID", "--by"}, []string{"-ID", "--by"}, "ops"},
	} {
		fs, _ := newFlagSet("test", &strings.Builder{})
		by := fs.String("by", "", "")
		pos, err := parseArgs(fs, tc.args, len(tc.pos), "usage")
		require.NoError(t, err, tc.args)
		require.Equal(t, tc.pos, pos, tc.args)
		require.Equal(t, tc.by, *by, tc.args)
	}
}
