package jobs_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// eventsOf counts the outbox events of each of ids.
func (f *fixture) eventsOf(t *testing.T, ids ...uuid.UUID) map[uuid.UUID][]string {
	t.Helper()
	out := map[uuid.UUID][]string{}
	for _, e := range f.events(t) {
		for _, id := range ids {
			if e.aggregate == id {
				out[id] = append(out[id], e.eventType)
			}
		}
	}
	return out
}

// Jobs of a kind in Config.KindsWithoutEvents write no outbox row in any
// transition (acceptance, retry, completion, cancel, reaper, deadline,
// replay), even when a store without the setting makes the transition: the
// decision is the accepting store's, recorded on the job, and a replay
// keeps it. Other kinds keep
// every event, in the same batches.
func TestKindsWithoutEventsWriteNoEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	quietStore, err := jobs.NewStore(jobs.Config{Schema: f.schema, KindsWithoutEvents: []string{"quiet"}})
	require.NoError(t, err)

	enqueue := func(kind string, opts ...func(*jobs.EnqueueParams)) []uuid.UUID {
		t.Helper()
		// Both kinds in one batch: the setting is per job, not per call.
		var params []jobs.EnqueueParams
		for _, k := range []string{kind, "k"} {
			p := jobs.EnqueueParams{Tenant: "acme", Kind: k}
			for _, o := range opts {
				o(&p)
			}
			params = append(params, p)
		}
		res, err := quietStore.EnqueueMany(ctx, f.pool, params)
		require.NoError(t, err)
		return []uuid.UUID{res[0].Job.ID, res[1].Job.ID}
	}
	claimAll := func(kinds ...string) map[uuid.UUID]*jobs.Job {
		t.Helper()
		claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{
			Queue: "default", Kinds: kinds, Worker: "w", Limit: 10, LeaseDuration: time.Minute,
		})
		require.NoError(t, err)
		byID := map[uuid.UUID]*jobs.Job{}
		for _, j := range claimed {
			byID[j.ID] = j
		}
		return byID
	}

	// Acceptance, a failed attempt's retry, then success: the runner's
	// store (f.store) has no setting of its own.
	ids := enqueue("quiet")
	claimed := claimAll("quiet", "k")
	require.Len(t, claimed, 2)
	var retries []jobs.Completion
	for _, j := range claimed {
		c := succeeded(j, `{}`)
		c.Outcome, c.Error, c.ErrorClass = jobs.OutcomeRetry, "flaky", "transient"
		retries = append(retries, c)
	}
	_, err = f.store.Complete(ctx, f.pool, retries)
	require.NoError(t, err)
	f.setState(t, ids[0], "available_at = now()")
	f.setState(t, ids[1], "available_at = now()")
	claimed = claimAll("quiet", "k")
	require.Len(t, claimed, 2)
	var done []jobs.Completion
	for _, j := range claimed {
		done = append(done, succeeded(j, `{"ok":true}`))
	}
	results, err := f.store.Complete(ctx, f.pool, done)
	require.NoError(t, err)
	for _, r := range results {
		require.Equal(t, jobs.StateSucceeded, r.State)
	}
	got := f.eventsOf(t, ids...)
	require.Empty(t, got[ids[0]])
	require.Equal(t, []string{"k.requested", "k.retry_scheduled", "k.completed"}, got[ids[1]])

	// Cancelled while waiting.
	cancelled := enqueue("quiet")
	for _, id := range cancelled {
		j, err := f.store.Cancel(ctx, f.pool, "acme", id)
		require.NoError(t, err)
		require.Equal(t, jobs.StateCancelled, j.State)
	}
	got = f.eventsOf(t, cancelled...)
	require.Empty(t, got[cancelled[0]])
	require.Equal(t, []string{"k.requested", "k.cancelled"}, got[cancelled[1]])

	// Taken back by the reaper with no attempts left: dead-lettered.
	reaped := enqueue("quiet", func(p *jobs.EnqueueParams) { p.MaxAttempts = 1 })
	require.Len(t, claimAll("quiet", "k"), 2)
	for _, id := range reaped {
		f.expireLease(t, id)
	}
	reap, err := f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 2, reap.LeaseFailed)
	got = f.eventsOf(t, reaped...)
	require.Empty(t, got[reaped[0]])
	require.Equal(t, []string{"k.requested", "k.dead_lettered"}, got[reaped[1]])

	// Past the deadline before it started.
	late := enqueue("quiet", func(p *jobs.EnqueueParams) { p.DeadlineAt = time.Now().Add(time.Hour) })
	for _, id := range late {
		f.setState(t, id, "deadline_at = now() - interval '1 second'")
	}
	reap, err = f.store.Reap(ctx, f.pool, jobs.ReapParams{})
	require.NoError(t, err)
	require.Equal(t, 2, reap.DeadlineFail)
	got = f.eventsOf(t, late...)
	require.Empty(t, got[late[0]])
	require.Equal(t, []string{"k.requested", "k.dead_lettered"}, got[late[1]])

	// A replay is a new acceptance, by the replaying store's setting.
	for i, id := range reaped {
		again, err := quietStore.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: "acme", JobID: id, By: "ops", Reason: "test"})
		require.NoError(t, err)
		got = f.eventsOf(t, again.Job.ID)
		if i == 0 {
			require.Empty(t, got[again.Job.ID])
		} else {
			require.Equal(t, []string{"k.requested"}, got[again.Job.ID])
		}
	}

	// An operator tool's store (llmq jobs replay, the console) knows
	// nothing of the host's setting: its replay keeps the source job's.
	for i, id := range late {
		again, err := f.store.Replay(ctx, f.pool, jobs.ReplayParams{Tenant: "acme", JobID: id, By: "ops", Reason: "operator tool"})
		require.NoError(t, err)
		got = f.eventsOf(t, again.Job.ID)
		if i == 0 {
			require.Empty(t, got[again.Job.ID])
		} else {
			require.Equal(t, []string{"k.requested"}, got[again.Job.ID])
		}
	}
}

// A kind name the store could never match is refused at construction.
func TestKindsWithoutEventsRejectsBadNames(t *testing.T) {
	t.Parallel()
	_, err := jobs.NewStore(jobs.Config{KindsWithoutEvents: []string{"ok", "not a kind"}})
	require.ErrorContains(t, err, "KindsWithoutEvents")
	require.ErrorContains(t, err, `"not a kind"`)
}
