package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// routedAttempt enqueues a job of tenant, claims it and completes its
// attempt with outcome o, served by candidate and model after moves.
func (f *fixture) routedAttempt(t *testing.T, tenant string, o jobs.CompletionOutcome, candidate, model string,
	usage jobs.Usage, moves ...jobs.Move) *jobs.Job {
	t.Helper()
	_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "k"})
	require.NoError(t, err)
	// A claim may come up empty on a tenant with nothing runnable, marking
	// it idle; the next one reaches this job.
	var j *jobs.Job
	for range 5 {
		claimed, err := f.store.Claim(t.Context(), f.pool, jobs.ClaimParams{
			Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 1, LeaseDuration: time.Minute})
		require.NoError(t, err)
		if len(claimed) == 1 {
			j = claimed[0]
			break
		}
	}
	require.NotNil(t, j, "the job of %s is claimed", tenant)
	c := jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "w", Outcome: o,
		Usage: usage, Candidate: candidate, Model: model, Moves: moves}
	switch o {
	case jobs.OutcomeSucceeded:
		c.Result = []byte(`{}`)
	case jobs.OutcomeRetry, jobs.OutcomeSnoozed:
		c.ErrorClass, c.Error, c.RetryDelay = jobs.ClassTransient, "every candidate failed", time.Hour
	}
	out, err := f.store.Complete(t.Context(), f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
	return j
}

// CandidateStats counts, per candidate and model, the attempts that ended
// on it by outcome with their usage, and its calls that moved on by
// failure, the busiest first; a tenant sees its own jobs' only, and an
// attempt without a route counts nowhere.
func TestCandidateStats(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	rateLimited := jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "rate_limited", InputTokens: 100}
	timeout := jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "timeout", Uncertain: true}
	f.routedAttempt(t, "acme", jobs.OutcomeSucceeded, "openai-us", "gpt-large", jobs.Usage{InputTokens: 1000, OutputTokens: 200}, rateLimited)
	f.routedAttempt(t, "acme", jobs.OutcomeRetry, "openai-us", "gpt-large", jobs.Usage{InputTokens: 500}, timeout)
	f.routedAttempt(t, "acme", jobs.OutcomeSnoozed, "anthropic-eu", "claude-sonnet", jobs.Usage{})
	// Moved on twice, then no candidate could grant: moves, no candidate.
	f.routedAttempt(t, "acme", jobs.OutcomeSnoozed, "", "", jobs.Usage{}, rateLimited,
		jobs.Move{Candidate: "openai-us", Model: "gpt-large", Failure: "timeout"})
	f.routedAttempt(t, "globex", jobs.OutcomeSucceeded, "local", "llama-70b", jobs.Usage{InputTokens: 10, OutputTokens: 5})
	f.routedAttempt(t, "acme", jobs.OutcomeSucceeded, "", "", jobs.Usage{InputTokens: 7}) // no route
	// An attempt that started before the window is not counted.
	old := f.routedAttempt(t, "acme", jobs.OutcomeSucceeded, "openai-us", "gpt-large", jobs.Usage{InputTokens: 1})
	_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".job_attempts SET started_at = now() - interval '2 hours' WHERE job_id = $1", old.ID)
	require.NoError(t, err)

	anthropic := jobs.CandidateStats{Candidate: "anthropic-eu", Model: "claude-sonnet", Attempts: 1, Snoozed: 1,
		MovedFrom: 3, MovedFromByFailure: map[string]int64{"rate_limited": 2, "timeout": 1}}
	openai := jobs.CandidateStats{Candidate: "openai-us", Model: "gpt-large", Attempts: 2, Succeeded: 1, Failed: 1,
		MovedFrom: 1, MovedFromByFailure: map[string]int64{"timeout": 1}, InputTokens: 1500, OutputTokens: 200}
	local := jobs.CandidateStats{Candidate: "local", Model: "llama-70b", Attempts: 1, Succeeded: 1, InputTokens: 10, OutputTokens: 5}

	since := time.Now().Add(-time.Hour)
	stats, err := f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: since})
	require.NoError(t, err)
	require.Equal(t, []jobs.CandidateStats{anthropic, openai, local}, stats)

	stats, err = f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: since, Tenant: "acme"})
	require.NoError(t, err)
	require.Equal(t, []jobs.CandidateStats{anthropic, openai}, stats, "acme's only")
	stats, err = f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: since, Tenant: "globex"})
	require.NoError(t, err)
	require.Equal(t, []jobs.CandidateStats{local}, stats, "globex's only")
	stats, err = f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: since, Tenant: "initech"})
	require.NoError(t, err)
	require.Empty(t, stats)

	stats, err = f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: since, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []jobs.CandidateStats{anthropic}, stats, "the busiest first")

	stats, err = f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: time.Now().Add(-3 * time.Hour)})
	require.NoError(t, err)
	require.Len(t, stats, 3)
	require.Equal(t, int64(3), stats[1].Attempts, "a wider window counts the older attempt")
	require.Equal(t, int64(1501), stats[1].InputTokens)

	stats, err = f.store.CandidateStats(ctx, f.pool, jobs.CandidateStatsParams{Since: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Empty(t, stats, "nothing started in the future")
}

// CandidateStats refuses a missing window, a malformed tenant and a limit
// out of range, naming the field.
func TestCandidateStatsRejectsBadParams(t *testing.T) {
	t.Parallel()
	f := setup(t)
	now := time.Now()
	for _, tc := range []struct {
		name  string
		p     jobs.CandidateStatsParams
		field string
	}{
		{"zero since", jobs.CandidateStatsParams{}, "Since"},
		{"zero since with a tenant", jobs.CandidateStatsParams{Tenant: "acme"}, "Since"},
		{"tenant with a control character", jobs.CandidateStatsParams{Since: now, Tenant: "a\x00"}, "Tenant"},
		{"negative limit", jobs.CandidateStatsParams{Since: now, Limit: -1}, "Limit"},
		{"limit too high", jobs.CandidateStatsParams{Since: now, Limit: jobs.MaxListLimit + 1}, "Limit"},
	} {
		stats, err := f.store.CandidateStats(t.Context(), f.pool, tc.p)
		var invalid *llmqtype.ValidationError
		require.ErrorAs(t, err, &invalid, tc.name)
		require.Equal(t, tc.field, invalid.Field, tc.name)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, tc.name)
		require.Contains(t, err.Error(), tc.field, tc.name)
		require.Nil(t, stats, tc.name)
	}
	stats, err := f.store.CandidateStats(t.Context(), f.pool, jobs.CandidateStatsParams{Since: now, Limit: jobs.MaxListLimit})
	require.NoError(t, err)
	require.Empty(t, stats)
}
