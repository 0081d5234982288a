package retention_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/retention"
)

// A holder whose batch runs past its lease keeps it until that batch
// commits: a standby finds the lease row locked and stands by (it does not
// wait, and deletes nothing) however long ago lease_until passed. Once the
// slow batch commits, the old holder's next batch finds the lease lapsed
// and stops, and the standby takes over: never two batches at once, and
// every due job is deleted exactly once.
func TestTakeoverWaitsForTheBatchInFlight(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.finishedBacklog(t, 300)
	a := f.service(t, retention.Config{ID: "a", Interval: 100 * time.Millisecond, Lease: 300 * time.Millisecond, BatchSize: 100})
	b := f.service(t, retention.Config{ID: "b", Interval: 100 * time.Millisecond, Lease: 300 * time.Millisecond, BatchSize: 100})

	var inBatch, overlaps atomic.Int64
	track := func(pause func(pgx.Tx)) func(pgx.Tx) {
		return func(tx pgx.Tx) {
			if inBatch.Add(1) > 1 {
				overlaps.Add(1)
			}
			pause(tx)
			inBatch.Add(-1)
		}
	}
	inFlight, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseBatch := func() { releaseOnce.Do(func() { close(release) }) }
	var first atomic.Bool
	var renewedUntil time.Time // the lease as a's first batch renewed it, uncommitted
	var readErr error
	retention.SetBeforeCommit(a, track(func(tx pgx.Tx) {
		if first.CompareAndSwap(false, true) {
			readErr = tx.QueryRow(context.Background(), "SELECT lease_until FROM "+f.db.Schema+".retention_lease").Scan(&renewedUntil)
			close(inFlight)
			<-release
		}
	}))
	retention.SetBeforeCommit(b, track(func(pgx.Tx) {}))
	type result struct {
		pass retention.Pass
		err  error
	}
	aDone, aExited := make(chan result, 1), make(chan struct{})
	go func() {
		defer close(aExited)
		pass, err := a.PruneOnce(ctx)
		aDone <- result{pass, err}
	}()
	// Should a require below fail, a's batch must still commit or roll
	// back before the schema is dropped (cleanups run last first, so this
	// one runs before setup's), or the drop waits on its open transaction.
	t.Cleanup(func() {
		releaseBatch()
		<-aExited
	})
	select {
	case <-inFlight:
	case res := <-aDone:
		require.FailNow(t, "a's pass ended before its first batch committed", "pass %+v, err %v", res.pass, res.err)
	}
	require.NoError(t, readErr)
	// Wait until the lease a's batch renewed has lapsed by the database's
	// clock, with that batch still uncommitted.
	require.Eventually(t, func() bool {
		var lapsed bool
		require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT $1 < now()", renewedUntil).Scan(&lapsed))
		return lapsed
	}, 10*time.Second, 10*time.Millisecond)

	start := time.Now()
	pass, err := b.PruneOnce(ctx)
	require.ErrorIs(t, err, retention.ErrNotHolder, "no takeover while a's batch is in flight")
	require.Zero(t, pass.Batches)
	require.Less(t, time.Since(start), 5*time.Second, "the standby does not wait for the batch")
	require.Equal(t, 300, f.count(t, "jobs"))

	releaseBatch()
	res := <-aDone
	require.ErrorIs(t, res.err, retention.ErrNotHolder, "a's next batch finds its lease lapsed")
	require.Equal(t, 1, res.pass.Batches)
	require.Equal(t, 200, f.count(t, "jobs"), "a's batch in flight committed")

	pass, err = b.PruneOnce(ctx)
	require.NoError(t, err, "b takes the lapsed lease over")
	require.Equal(t, retention.Count{Table: "jobs", Class: "SUCCEEDED", Rows: 200}, pass.Deleted[0])
	require.Zero(t, f.count(t, "jobs"))
	require.Zero(t, f.count(t, "job_keys"))
	require.Zero(t, overlaps.Load(), "two batches ran at once")
}

// A one-off pass (llmq prune) with a policy of its own prunes by it, but
// leaves the running service's recorded policy and last pass as they were.
func TestOneOffPassKeepsTheRecordedPolicy(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	svc := f.service(t, retention.Config{ID: "svc", Policy: retention.Policy{Succeeded: 48 * time.Hour}})
	_, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, svc.Release(ctx))
	before, err := svc.Status(ctx)
	require.NoError(t, err)
	require.NotNil(t, before.Policy)
	require.NotNil(t, before.LastPass)

	f.finishedBacklog(t, 10) // finished two days ago
	oneOff := f.service(t, retention.Config{ID: "prune", OneOff: true, Policy: retention.Policy{Succeeded: time.Hour, IdempotencyWindow: time.Hour}})
	pass, err := oneOff.PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, retention.Count{Table: "jobs", Class: "SUCCEEDED", Rows: 10}, pass.Deleted[0])
	require.NoError(t, oneOff.Release(ctx))

	after, err := svc.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Policy, after.Policy)
	require.Equal(t, 48*time.Hour, after.Policy.Succeeded)
	require.Equal(t, before.LastPassAt, after.LastPassAt)
	require.Equal(t, before.LastPass, after.LastPass)
	require.False(t, after.Held)
}

// Expired permits are reaped a pool per batch, never every pool's row
// locked in one transaction: with a batch size of 2, three pools holding
// 3, 1 and 0 expired permits take three batches that reap, and every
// pool's in_flight is handed its slots back.
func TestExpiredPermitsAreReapedAPoolPerBatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.exec(t, `INSERT INTO %s.admission_pools (name, rpm, tpm, max_in_flight, request_burst, token_burst, request_level, token_level, in_flight)
		VALUES ('a', 60, 1000, 10, 60, 1000, 60, 1000, 4), ('b', 60, 1000, 10, 60, 1000, 60, 1000, 1), ('c', 60, 1000, 10, 60, 1000, 60, 1000, 1)`)
	f.exec(t, `INSERT INTO %s.admission_permits (id, pool, tokens, expires_at) VALUES
		(gen_random_uuid(), 'a', 1, now() - interval '3 minutes'), (gen_random_uuid(), 'a', 1, now() - interval '2 minutes'),
		(gen_random_uuid(), 'a', 1, now() - interval '1 minute'), (gen_random_uuid(), 'a', 1, now() + interval '1 hour'),
		(gen_random_uuid(), 'b', 1, now() - interval '1 minute'), (gen_random_uuid(), 'c', 1, now() + interval '1 hour')`)
	svc := f.service(t, retention.Config{BatchSize: 2, Policy: retention.Policy{
		Succeeded: retention.Never, ReviewRequired: retention.Never, FailedTerminal: retention.Never, Cancelled: retention.Never,
		PublishedEvents: retention.Never, InboxRecords: retention.Never, InboxQuarantine: retention.Never, WebhookDeliveries: retention.Never,
	}})
	var pools [][]string
	var queryErr error
	retention.SetBeforeCommit(svc, func(tx pgx.Tx) {
		// The pool rows this batch's transaction has written (or locked).
		rows, err := tx.Query(context.Background(), "SELECT name FROM "+f.db.Schema+".admission_pools WHERE pg_current_xact_id()::xid IN (xmin, xmax) ORDER BY name")
		if err == nil {
			var locked []string
			locked, err = pgx.CollectRows(rows, pgx.RowTo[string])
			pools = append(pools, locked)
		}
		queryErr = errors.Join(queryErr, err)
	})
	pass, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []retention.Count{{Table: "admission_permits", Class: "expired", Rows: 4}}, pass.Deleted)
	require.NoError(t, queryErr)
	// The first batch is the reuse invalidations' (none due, no pool row);
	// then one pool row per batch; the last found no pool left.
	require.Equal(t, [][]string{{}, {"a"}, {"a"}, {"b"}, {}}, pools)
	require.Equal(t, 5, pass.Batches)
	rows, err := f.db.Pool.Query(ctx, "SELECT in_flight FROM "+f.db.Schema+".admission_pools ORDER BY name")
	require.NoError(t, err)
	inFlight, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1, 0, 1}, inFlight)
	require.Equal(t, 2, f.count(t, "admission_permits"))
}

// Status judges the lease by the database's clock and reads the number of
// finished jobs per state, exactly while small.
func TestStatusUsesTheDatabaseClock(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	f.finishedBacklog(t, 5)
	svc := f.service(t, retention.Config{ID: "svc", Policy: retention.Policy{Succeeded: retention.Never}})
	_, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	st, err := svc.Status(ctx)
	require.NoError(t, err)
	require.True(t, st.Held)
	require.Equal(t, "svc", st.Holder)
	require.WithinDuration(t, time.Now(), st.Now, time.Minute)
	require.Equal(t, retention.Oldest{Table: "jobs", Class: string(jobs.StateSucceeded), At: st.Oldest[0].At, Rows: 5}, st.Oldest[0])
	// A lease that lapsed by the database's clock is not held, whatever
	// the reader's clock says.
	f.exec(t, `UPDATE %s.retention_lease SET lease_until = now() - interval '1 second'`)
	st, err = svc.Status(ctx)
	require.NoError(t, err)
	require.False(t, st.Held)
	require.Equal(t, "svc", st.Holder)
}

// A policy recorded by an earlier version reads with the defaults of the
// fields it lacks even when a field it has is refused now (a
// WebhookDeliveries below the floor), and that field reads as recorded.
func TestStatusFillsAnOldRecordedPolicy(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	svc := f.service(t, retention.Config{ID: "svc"})
	_, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	f.exec(t, `UPDATE %s.retention_lease SET policy = (policy - 'inbox_quarantine') || '{"webhook_deliveries": "12h0m0s"}'`)
	st, err := svc.Status(ctx)
	require.NoError(t, err)
	require.NotNil(t, st.Policy)
	require.Equal(t, retention.DefaultInboxQuarantine, st.Policy.InboxQuarantine)
	require.Equal(t, 12*time.Hour, st.Policy.WebhookDeliveries)
	require.Equal(t, retention.DefaultSucceeded, st.Policy.Succeeded)
}
