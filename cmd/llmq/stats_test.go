package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// routedAttempt runs one attempt of a new job of tenant and kind, ended
// on candidate (empty: none) with outcome o after moves.
func (f *fixture) routedAttempt(tenant, kind string, o jobs.CompletionOutcome, candidate, model string, usage jobs.Usage, moves ...jobs.Move) uuid.UUID {
	f.t.Helper()
	ctx := f.t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: kind})
	require.NoError(f.t, err)
	job := f.claim(kind)
	c := jobs.Completion{Lease: jobs.Lease{JobID: job.ID, Fence: job.Fence}, Attempt: job.Attempt, Worker: "w1", Outcome: o,
		Usage: usage, Candidate: candidate, Model: model, Moves: moves}
	switch o {
	case jobs.OutcomeSucceeded:
		c.Result = json.RawMessage(`{}`)
	default:
		c.ErrorClass, c.Error, c.RetryDelay = jobs.ClassTransient, "503", time.Hour
	}
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(f.t, err)
	require.NoError(f.t, out[0].Err)
	return job.ID
}

// stats shows what each route candidate did in the last hour: a table, a
// field of --json, and no table at all where no kind has a route.
func TestStatsRoutes(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	ctx := t.Context()

	f.routedAttempt("acme", "plain", jobs.OutcomeSucceeded, "", "", jobs.Usage{InputTokens: 5})
	code, out, stderr := f.run("stats")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "route candidates", "no routed attempt, no table")
	require.NotContains(t, out, "CANDIDATE")
	code, out, stderr = f.run("stats", "--json")
	require.Equal(t, 0, code, stderr)
	var report statsReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.NotNil(t, report.Routes, "an empty list, not null")
	require.Empty(t, report.Routes)
	require.InDelta(t, time.Hour.Seconds(), report.RoutesWindowSeconds, 1e-9)

	rateLimited := jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "rate_limited"}
	f.routedAttempt("acme", "extract", jobs.OutcomeSucceeded, "openai-us", "gpt-large", jobs.Usage{InputTokens: 1200, OutputTokens: 80}, rateLimited)
	f.routedAttempt("globex", "extract", jobs.OutcomeRetry, "openai-us", "gpt-large", jobs.Usage{InputTokens: 300},
		rateLimited, jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "timeout"})
	f.routedAttempt("acme", "extract", jobs.OutcomeSnoozed, "anthropic-eu", "claude-sonnet", jobs.Usage{})

	code, out, stderr = f.run("stats", "--json")
	require.Equal(t, 0, code, stderr)
	report = statsReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Equal(t, []jobs.CandidateStats{
		{Candidate: "anthropic-eu", Model: "claude-sonnet", Attempts: 1, Snoozed: 1, MovedFrom: 3,
			MovedFromByFailure: map[string]int64{"rate_limited": 2, "timeout": 1}},
		{Candidate: "openai-us", Model: "gpt-large", Attempts: 2, Succeeded: 1, Failed: 1, InputTokens: 1500, OutputTokens: 80},
	}, report.Routes, "every tenant's, the busiest first")

	code, out, stderr = f.run("stats")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "route candidates, attempts started in the last 1h0m0s:")
	require.Regexp(t, `CANDIDATE\s+MODEL\s+ATTEMPTS\s+SUCCEEDED\s+FAILED\s+SNOOZED\s+MOVED FROM\s+TOKENS IN/OUT\n`, out)
	require.Regexp(t, `anthropic-eu\s+claude-sonnet\s+1\s+0\s+0\s+1\s+3 \(rate_limited 2, timeout 1\)\s+0/0\n`, out)
	require.Regexp(t, `openai-us\s+gpt-large\s+2\s+1\s+1\s+0\s+0\s+1500/80\n`, out)
	require.Less(t, strings.Index(out, "QUEUE  KIND"), strings.Index(out, "route candidates"), "after the kinds")
	require.Less(t, strings.Index(out, "route candidates"), strings.Index(out, "\nretention: "), "before retention")

	// Attempts that started before the window are not counted; a wider
	// window counts them.
	_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".job_attempts SET started_at = now() - interval '3 hours'")
	require.NoError(t, err)
	code, out, stderr = f.run("stats")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "route candidates")
	code, out, stderr = f.run("stats", "-routes-window", "4h", "--json")
	require.Equal(t, 0, code, stderr)
	report = statsReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Len(t, report.Routes, 2)
	require.InDelta(t, (4 * time.Hour).Seconds(), report.RoutesWindowSeconds, 1e-9)

	for _, window := range []string{"0s", "-1h"} {
		code, out, stderr = f.run("stats", "-routes-window", window)
		require.Equal(t, 2, code, "a window of %s is refused input", window)
		require.Empty(t, out)
		require.Contains(t, stderr, "-routes-window must be positive")
	}
}
