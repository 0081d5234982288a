package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/retention"
)

// llmq prune --dry-run counts what is due and deletes nothing; llmq prune
// deletes it; flags override the policy, and bad ones exit 2.
func TestPruneCommand(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	dead := f.deadJob("acme", "k")
	_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET finished_at = now() - interval '3 days' WHERE id = $1", dead)
	require.NoError(t, err)

	code, out, stderr := f.run("prune", "--dry-run", "--json")
	require.Equal(t, 0, code, stderr)
	var report pruneReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.True(t, report.DryRun)
	require.Contains(t, report.Rows, retention.Count{Table: "jobs", Class: "FAILED_TERMINAL", Rows: 0}, "dead letters are kept 30 days by default")

	code, out, stderr = f.run("prune", "--dry-run", "--failed-terminal", "2d")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "failed_terminal 2d")
	require.Regexp(t, `jobs\s+FAILED_TERMINAL\s+1`, out)
	var n int
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.schema+".jobs").Scan(&n))
	require.Equal(t, 1, n, "a dry run deletes nothing")

	code, out, stderr = f.run("prune", "--failed-terminal", "2d", "--json")
	require.Equal(t, 0, code, stderr)
	report = pruneReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Contains(t, report.Rows, retention.Count{Table: "jobs", Class: "FAILED_TERMINAL", Rows: 1})
	require.Contains(t, report.Rows, retention.Count{Table: "job_attempts", Rows: 1})
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.schema+".jobs").Scan(&n))
	require.Zero(t, n)

	// stats shows the oldest row per table and does not call events
	// nobody relays lag; the prune's flags were its own, recorded nowhere.
	_, err = f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	code, out, stderr = f.run("stats")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "no relay has run on this schema, so this is not lag")
	require.Contains(t, out, "no retention service has recorded a policy")
	require.NotContains(t, out, "failed_terminal 2d")
	require.Regexp(t, `inbox\s+-\s+-\s+-`, out)
	require.Regexp(t, `jobs\s+SUCCEEDED\s+0\s+-`, out)

	// With a service's policy recorded, prune starts from it, and leaves
	// it recorded whatever its flags.
	svc, err := retention.New(f.pool, retention.Config{Schema: f.schema, ID: "svc", Policy: retention.Policy{FailedTerminal: 10 * 24 * time.Hour}})
	require.NoError(t, err)
	_, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, svc.Release(ctx))
	code, out, stderr = f.run("prune", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "failed_terminal 10d")
	code, _, stderr = f.run("prune", "--failed-terminal", "2d", "--succeeded", "1d")
	require.Equal(t, 0, code, stderr)
	code, out, stderr = f.run("stats", "--json")
	require.Equal(t, 0, code, stderr)
	var stats statsReport
	require.NoError(t, json.Unmarshal([]byte(out), &stats))
	require.NotNil(t, stats.Retention.Policy)
	require.Equal(t, 10*24*time.Hour, stats.Retention.Policy.FailedTerminal, "the service's policy stays recorded")
	require.False(t, stats.Retention.Held, "the prune released the lease")
	require.Zero(t, stats.Retention.Relay.Acquisitions)

	for _, bad := range [][]string{{"--succeeded", "0"}, {"--succeeded", "soon"}, {"--inbox-records", "1m"}, {"--batch", "-1"}, {"extra"}} {
		code, _, stderr = f.run(append([]string{"prune", "--dry-run"}, bad...)...)
		require.Equal(t, 2, code, "%v: %s", bad, stderr)
	}
}

// A policy recorded by an earlier version, before InboxQuarantine existed
// and with WebhookDeliveries below today's floor, reads with the default
// quarantine retention; prune refuses to use its webhook retention, naming
// the flag to give, and prunes by the rest of it once that flag is given.
func TestPruneOldRecordedPolicy(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()
	svc, err := retention.New(f.pool, retention.Config{Schema: f.schema, ID: "svc", Policy: retention.Policy{FailedTerminal: 10 * 24 * time.Hour}})
	require.NoError(t, err)
	_, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, svc.Release(ctx))
	_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+`.retention_lease SET policy = (policy - 'inbox_quarantine') || '{"webhook_deliveries": "12h0m0s"}'`)
	require.NoError(t, err)

	code, out, stderr := f.run("stats", "--json")
	require.Equal(t, 0, code, stderr)
	var stats statsReport
	require.NoError(t, json.Unmarshal([]byte(out), &stats))
	require.NotNil(t, stats.Retention.Policy)
	require.Equal(t, retention.DefaultInboxQuarantine, stats.Retention.Policy.InboxQuarantine, "a field the recorded policy lacks reads as its default")
	require.Equal(t, 12*time.Hour, stats.Retention.Policy.WebhookDeliveries, "a refused field reads as recorded")

	code, _, stderr = f.run("prune", "--dry-run")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "Policy.WebhookDeliveries")
	require.Contains(t, stderr, "give --webhook-deliveries")

	code, out, stderr = f.run("prune", "--dry-run", "--webhook-deliveries", "30d")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "failed_terminal 10d")
	require.Contains(t, out, "inbox_quarantine 30d")
}
