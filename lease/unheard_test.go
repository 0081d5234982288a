package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// lostReplyStore is the real store, except that one claim that leased jobs
// reports a failure instead, as a claim does whose commit reached Postgres
// but whose reply was lost with the connection.
type lostReplyStore struct {
	jobs.RunnerStore
	lose atomic.Bool
}

func (s *lostReplyStore) Claim(ctx context.Context, db jobs.DBTX, p jobs.ClaimParams) ([]*jobs.Job, error) {
	claimed, err := s.RunnerStore.Claim(ctx, db, p)
	if err == nil && len(claimed) > 0 && s.lose.CompareAndSwap(true, false) {
		return nil, errors.New("injected: the connection closed before the claim's reply arrived")
	}
	return claimed, err
}

// Jobs leased by a claim whose reply never arrived are handed back once
// the claim's timeout has passed (a third of the lease), not left RUNNING
// until the reaper counts an attempt that never started: their first
// attempt is recorded as snoozed, with why, their budget is intact, and
// they then run normally.
func TestRunnerReleasesLeasesOfALostClaimReply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var started atomic.Int32
	cfg := fastConfig(map[string]lease.Handler{"k": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
		started.Add(1)
		return json.RawMessage(`{"ok":true}`), nil
	})})
	cfg.ClaimBatch = 10
	cfg.LeaseDuration = 6e9 // 6s: the reaper would take the jobs back only after it
	// Queued before the runner starts, so its first claim, the lost one,
	// leases them all.
	const n = 3
	queued := f.enqueueMany("acme", n, jobs.EnqueueParams{Kind: "k"})
	store := &lostReplyStore{RunnerStore: f.store}
	store.lose.Store(true)
	f.startWith(store, cfg)

	for _, j := range queued {
		done := f.await(j.ID)
		require.Equal(t, jobs.StateSucceeded, done.State)
		require.Equal(t, jobs.DefaultMaxAttempts+1, done.MaxAttempts, "the released attempt does not count")
		attempts := f.attempts(j.ID)
		require.Len(t, attempts, 2)
		require.Equal(t, jobs.AttemptSnoozed, attempts[0].Outcome, "%+v", attempts[0])
		require.Contains(t, attempts[0].Error, "reply never reached the runner")
		require.False(t, attempts[0].Usage.Uncertain, "it never started, so no provider call can have been made")
		require.Equal(t, jobs.AttemptSucceeded, attempts[1].Outcome)
	}
	require.Equal(t, int32(n), started.Load(), "each job ran once")
}
