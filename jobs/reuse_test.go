package jobs_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// enqueueReusable accepts a job of kind "k" for tenant with reuse.
func (f *fixture) enqueueReusable(t *testing.T, tenant string, reuse jobs.Reuse) *jobs.Job {
	t.Helper()
	res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "k", Reuse: &reuse})
	require.NoError(t, err)
	return res.Job
}

// claimUpTo claims up to ten jobs of kind "k".
func (f *fixture) claimUpTo(t *testing.T) []*jobs.Job {
	t.Helper()
	claimed, err := f.store.Claim(t.Context(), f.pool, jobs.ClaimParams{
		Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 10, LeaseDuration: time.Minute,
	})
	require.NoError(t, err)
	return claimed
}

// complete records one completion and returns the job as it now is.
func (f *fixture) complete(t *testing.T, c jobs.Completion) *jobs.Job {
	t.Helper()
	out, err := f.store.Complete(t.Context(), f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
	job, err := f.store.Lookup(t.Context(), f.pool, c.JobID)
	require.NoError(t, err)
	return job
}

// reused is the completion a runner records for a claimed job that found a
// result to reuse.
func reused(j *jobs.Job) jobs.Completion {
	c := succeeded(j, string(j.Result))
	c.ReusedFrom = j.ReusedFrom
	return c
}

// A job whose key has a computed success takes its result: its claim
// carries the result and its source, the completion records the attempt as
// reused, and the job's events are those of a computed job. A reused job
// is never itself a source, so later jobs name the computed one.
func TestReuseTakesTheResultOfASucceededJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := jobs.Reuse{Key: "sha256:doc-1"}

	first := f.enqueueReusable(t, "acme", key)
	claimed := f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, uuid.Nil, claimed[0].ReusedFrom, "nothing to reuse yet: the handler runs")
	require.Equal(t, &jobs.Reuse{Key: "sha256:doc-1", TTL: jobs.DefaultReuseTTL}, claimed[0].Reuse)
	f.complete(t, succeeded(claimed[0], `{"total":42}`))

	second := f.enqueueReusable(t, "acme", key)
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, second.ID, claimed[0].ID)
	require.Equal(t, first.ID, claimed[0].ReusedFrom)
	require.JSONEq(t, `{"total":42}`, string(claimed[0].Result))
	done := f.complete(t, reused(claimed[0]))
	require.Equal(t, jobs.StateSucceeded, done.State)
	require.Equal(t, first.ID, done.ReusedFrom)
	require.JSONEq(t, `{"total":42}`, string(done.Result))

	attempts, err := f.store.Attempts(t.Context(), f.pool, "acme", second.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptReused, attempts[0].Outcome)
	require.Equal(t, first.ID, attempts[0].ReusedFrom)
	require.Zero(t, attempts[0].Usage.InputTokens+attempts[0].Usage.OutputTokens)

	events := f.eventsOf(t, first.ID, second.ID)
	require.Equal(t, events[first.ID], events[second.ID], "a reused job's events are a computed job's")

	third := f.enqueueReusable(t, "acme", key)
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, third.ID, claimed[0].ID)
	require.Equal(t, first.ID, claimed[0].ReusedFrom, "the computed job is the source, never a reused one")
}

// Only a SUCCEEDED job is a source: one that failed, needs review or was
// cancelled is not, and neither is one of another kind, another tenant
// (tenant scope), the other scope, or a result older than the TTL.
func TestReuseTakesOnlyASuccessInScopeWithinTheTTL(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	key := jobs.Reuse{Key: "sha256:doc"}

	finish := func(tenant string, reuse jobs.Reuse, outcome jobs.CompletionOutcome) *jobs.Job {
		j := f.enqueueReusable(t, tenant, reuse)
		claimed := f.claimUpTo(t)
		require.Len(t, claimed, 1)
		require.Equal(t, j.ID, claimed[0].ID)
		require.Equal(t, uuid.Nil, claimed[0].ReusedFrom)
		c := succeeded(claimed[0], `{"from":"`+tenant+`"}`)
		c.Outcome = outcome
		if outcome != jobs.OutcomeSucceeded {
			c.Error, c.ErrorClass = "no", jobs.ClassPermanent
		}
		return f.complete(t, c)
	}
	require.Equal(t, jobs.StateFailedTerminal, finish("acme", key, jobs.OutcomeFailed).State)
	require.Equal(t, jobs.StateReviewRequired, finish("acme", key, jobs.OutcomeReviewRequired).State)
	require.Equal(t, jobs.StateCancelled, finish("acme", key, jobs.OutcomeCancelled).State)
	// Successes elsewhere: another tenant's under tenant scope, and a
	// shared key's, which is another key space.
	finish("globex", key, jobs.OutcomeSucceeded)
	finish("acme", jobs.Reuse{Key: key.Key, Shared: true}, jobs.OutcomeSucceeded)
	// Another kind with the same key.
	other, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "other", Reuse: &key})
	require.NoError(t, err)
	otherClaim, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"other"}, Worker: "w", Limit: 1, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, otherClaim, 1)
	require.Equal(t, other.Job.ID, otherClaim[0].ID)
	f.complete(t, succeeded(otherClaim[0], `{"kind":"other"}`))

	// So acme's tenant-scoped job of kind k computes.
	finish("acme", key, jobs.OutcomeSucceeded)

	// A result older than the TTL is not taken.
	old := finish("initech", key, jobs.OutcomeSucceeded)
	f.setState(t, old.ID, "finished_at = now() - interval '2 hours'")
	j := f.enqueueReusable(t, "initech", jobs.Reuse{Key: key.Key, TTL: time.Hour})
	claimed := f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, j.ID, claimed[0].ID)
	require.Equal(t, uuid.Nil, claimed[0].ReusedFrom, "the only result is two hours old, the job accepts one")
	f.complete(t, succeeded(claimed[0], `{}`))

	j = f.enqueueReusable(t, "initech", jobs.Reuse{Key: key.Key, TTL: 3 * time.Hour})
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, j.ID, claimed[0].ID)
	require.NotEqual(t, old.ID, claimed[0].ReusedFrom, "the newest computed result within the TTL is taken")
	require.NotEqual(t, uuid.Nil, claimed[0].ReusedFrom)
}

// Under a shared key, a job of one tenant takes the result computed for
// another; under a tenant key it never does.
func TestSharedKeysCrossTenantsAndTenantKeysDoNot(t *testing.T) {
	t.Parallel()
	f := setup(t)
	shared := jobs.Reuse{Key: "sha256:public-doc", Shared: true}
	a := f.enqueueReusable(t, "acme", shared)
	claimed := f.claimUpTo(t)
	require.Len(t, claimed, 1)
	f.complete(t, succeeded(claimed[0], `{"answer":1}`))

	f.enqueueReusable(t, "globex", shared)
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, a.ID, claimed[0].ReusedFrom)
	require.Equal(t, "globex", claimed[0].Tenant)
	f.complete(t, reused(claimed[0]))

	private := jobs.Reuse{Key: "sha256:private-doc"}
	f.enqueueReusable(t, "acme", private)
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	f.complete(t, succeeded(claimed[0], `{"answer":"acme's"}`))
	f.enqueueReusable(t, "globex", private)
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, uuid.Nil, claimed[0].ReusedFrom, "globex never receives acme's result")
}

// Jobs of one key coalesce: one runs, the others wait while it runs (one
// claim takes one of them, and later claims pass over the rest), take its
// result when it succeeds, and run themselves when it fails.
func TestJobsOfOneKeyShareOneRun(t *testing.T) {
	t.Parallel()
	f := setup(t)
	key := jobs.Reuse{Key: "sha256:same"}
	var ids []uuid.UUID
	for range 4 {
		ids = append(ids, f.enqueueReusable(t, "acme", key).ID)
	}
	plain, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)

	claimed := f.claimUpTo(t)
	require.Len(t, claimed, 2, "one job of the key, and the job without one")
	require.ElementsMatch(t, []uuid.UUID{ids[0], plain.Job.ID}, []uuid.UUID{claimed[0].ID, claimed[1].ID})
	leader := claimed[0]
	if leader.ID != ids[0] {
		leader = claimed[1]
	}
	require.Empty(t, f.claimUpTo(t), "the others wait while their key runs")

	// The leader fails: one of the others runs.
	f.complete(t, jobs.Completion{Lease: jobs.Lease{JobID: leader.ID, Fence: leader.Fence}, Attempt: leader.Attempt,
		Worker: "w", Outcome: jobs.OutcomeRetry, ErrorClass: jobs.ClassTransient, Error: "busy", RetryDelay: time.Hour})
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 1)
	require.Equal(t, ids[1], claimed[0].ID)
	require.Equal(t, uuid.Nil, claimed[0].ReusedFrom)
	require.Empty(t, f.claimUpTo(t))

	// It succeeds: the rest take its result, in one claim.
	f.complete(t, succeeded(claimed[0], `{"once":true}`))
	claimed = f.claimUpTo(t)
	require.Len(t, claimed, 2)
	for _, c := range claimed {
		require.Contains(t, ids[2:], c.ID)
		require.Equal(t, ids[1], c.ReusedFrom)
		f.complete(t, reused(c))
	}
}

// An invalidation stops the results it covers from being reused, by key,
// by tenant or for every key of a kind; results computed after it are
// reused again.
func TestInvalidatedResultsAreNotReused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	compute := func(tenant, key string) *jobs.Job {
		j := f.enqueueReusable(t, tenant, jobs.Reuse{Key: key})
		claimed := f.claimUpTo(t)
		require.Len(t, claimed, 1)
		require.Equal(t, j.ID, claimed[0].ID)
		if claimed[0].ReusedFrom != uuid.Nil {
			return f.complete(t, reused(claimed[0]))
		}
		return f.complete(t, succeeded(claimed[0], `{}`))
	}
	a1 := compute("acme", "k1")
	compute("acme", "k2")
	g1 := compute("globex", "k1")
	require.Equal(t, a1.ID, compute("acme", "k1").ReusedFrom)

	inv, covered, err := f.store.InvalidateReuse(ctx, f.pool, jobs.InvalidateReuseParams{
		Kind: "k", Key: "k1", Tenant: "acme", By: "ops@example.com", Reason: "a wrong total"})
	require.NoError(t, err)
	require.Equal(t, int64(1), covered, "acme's one computed result of k1")
	require.Equal(t, "k1", inv.Key)
	require.Equal(t, uuid.Nil, compute("acme", "k1").ReusedFrom, "acme's k1 computes again")
	require.Equal(t, g1.ID, compute("globex", "k1").ReusedFrom, "globex's k1 is not covered")
	require.NotEqual(t, uuid.Nil, compute("acme", "k2").ReusedFrom, "acme's k2 is not covered")
	require.NotEqual(t, uuid.Nil, compute("acme", "k1").ReusedFrom, "the result computed after it is reused")

	_, _, err = f.store.InvalidateReuse(ctx, f.pool, jobs.InvalidateReuseParams{Kind: "k", By: "ops", Reason: "new model"})
	require.NoError(t, err)
	require.Equal(t, uuid.Nil, compute("acme", "k2").ReusedFrom)
	require.Equal(t, uuid.Nil, compute("globex", "k1").ReusedFrom)

	list, err := f.store.ReuseInvalidations(ctx, f.pool, "k", 10)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Empty(t, list[0].Key, "newest first: every key of the kind")
	require.Equal(t, "acme", list[1].Tenant)
	require.Equal(t, "a wrong total", list[1].Reason)
}

// A reuse key that is empty, too long or not text, and a TTL out of range,
// are refused before anything is written, naming the field.
func TestEnqueueRefusesABadReuse(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for name, tc := range map[string]struct {
		reuse jobs.Reuse
		field string
	}{
		"empty key":    {jobs.Reuse{}, "Reuse.Key"},
		"long key":     {jobs.Reuse{Key: strings.Repeat("k", jobs.MaxReuseKeyLen+1)}, "Reuse.Key"},
		"control":      {jobs.Reuse{Key: "a\x00b"}, "Reuse.Key"},
		"negative TTL": {jobs.Reuse{Key: "k", TTL: -time.Second}, "Reuse.TTL"},
		"long TTL":     {jobs.Reuse{Key: "k", TTL: jobs.MaxReuseTTL + time.Hour}, "Reuse.TTL"},
	} {
		_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Reuse: &tc.reuse})
		var ve *llmqtype.ValidationError
		require.ErrorAs(t, err, &ve, name)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, name)
		require.Equal(t, tc.field, ve.Field, name)
	}
	_, err := f.store.EnqueueMany(t.Context(), f.pool, []jobs.EnqueueParams{
		{Tenant: "acme", Kind: "k"}, {Tenant: "acme", Kind: "k", Reuse: &jobs.Reuse{}}})
	var ve *llmqtype.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "params[1].Reuse.Key", ve.Field)
	require.Zero(t, f.count(t, "jobs"), "nothing was written")

	_, _, err = f.store.InvalidateReuse(t.Context(), f.pool, jobs.InvalidateReuseParams{Kind: "k", By: "ops"})
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "Reason", ve.Field)
}

// ReuseKey is canonical: the same inputs, however their JSON is written,
// give the same key; different inputs different keys.
func TestReuseKeyIsCanonical(t *testing.T) {
	t.Parallel()
	a, err := jobs.ReuseKey(json.RawMessage(`{"model":"m","prompt":"v2","doc":"sha256:1"}`))
	require.NoError(t, err)
	b, err := jobs.ReuseKey(map[string]string{"doc": "sha256:1", "prompt": "v2", "model": "m"})
	require.NoError(t, err)
	require.Equal(t, a, b)
	c, err := jobs.ReuseKey(map[string]string{"doc": "sha256:1", "prompt": "v3", "model": "m"})
	require.NoError(t, err)
	require.NotEqual(t, a, c, "a new prompt version is a new key")
	require.True(t, strings.HasPrefix(a, "sha256:"))
	require.LessOrEqual(t, len(a), jobs.MaxReuseKeyLen)
}
