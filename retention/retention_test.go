package retention_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/retention"
	"github.com/llmq/llmq/webhook"
)

type fixture struct {
	db    *dbtest.DB
	store *jobs.PostgresStore
}

func setup(t testing.TB) *fixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 8})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	return &fixture{db: db, store: store}
}

func (f *fixture) service(t *testing.T, cfg retention.Config) *retention.Service {
	t.Helper()
	cfg.Schema = f.db.Schema
	s, err := retention.New(f.db.Pool, cfg)
	require.NoError(t, err)
	return s
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := f.db.Pool.Exec(t.Context(), fmt.Sprintf(sql, f.db.Schema), args...)
	require.NoError(t, err)
}

func (f *fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+"."+table).Scan(&n))
	return n
}

func (f *fixture) exists(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".jobs WHERE id = $1", id).Scan(&n))
	return n == 1
}

func (f *fixture) enqueue(t *testing.T, key string) *jobs.Job {
	t.Helper()
	res, err := f.store.Enqueue(t.Context(), f.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: key})
	require.NoError(t, err)
	return res.Job
}

// finish claims every waiting job and completes each with outcome, so
// each gets its attempt row and finish time the way a runner makes them.
func (f *fixture) finish(t *testing.T, outcome jobs.CompletionOutcome) []*jobs.Job {
	t.Helper()
	claimed, err := f.store.Claim(t.Context(), f.db.Pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 1000, LeaseDuration: time.Minute})
	require.NoError(t, err)
	cs := make([]jobs.Completion, len(claimed))
	for i, j := range claimed {
		cs[i] = jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: j.LeaseOwner, Outcome: outcome, Result: []byte(`{}`), ErrorClass: "x", Error: "x"}
	}
	res, err := f.store.Complete(t.Context(), f.db.Pool, cs)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	return claimed
}

// age moves a job's times into the past, as if it finished long ago.
func (f *fixture) age(t *testing.T, id uuid.UUID, d time.Duration) {
	t.Helper()
	f.exec(t, `UPDATE %s.jobs SET created_at = now() - $2::interval, finished_at = CASE WHEN finished_at IS NOT NULL THEN now() - $2::interval END WHERE id = $1`, id, d)
}

// Retention removes exactly what is due: finished jobs past their state's
// retention with their attempts and keys, published events, inbox ids and
// webhook deliveries past theirs, and expired permits (their slots handed
// back). Waiting, running and recent jobs survive however old they are, a
// surviving key still answers with its job, and a pruned job's key
// accepts a new job.
func TestPruneRemovesExactlyWhatIsDue(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	// Finished one at a time, so each completed event is a single-event
	// row that can be aged on its own (a completion of several jobs writes
	// their events as one batch row).
	oldDone := f.enqueue(t, "old-key")
	f.finish(t, jobs.OutcomeSucceeded)
	newDone := f.enqueue(t, "new-key")
	f.finish(t, jobs.OutcomeSucceeded)
	oldDead, newDead := f.enqueue(t, ""), f.enqueue(t, "")
	f.finish(t, jobs.OutcomeFailed)
	replay, err := f.store.Replay(ctx, f.db.Pool, jobs.ReplayParams{Tenant: "acme", JobID: oldDead.ID, By: "op", Reason: "r"})
	require.NoError(t, err)
	running := f.enqueue(t, "running-key")
	_, err = f.store.Claim(ctx, f.db.Pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 10, LeaseDuration: time.Hour})
	require.NoError(t, err)
	waiting := f.enqueue(t, "waiting-key")

	f.age(t, oldDone.ID, 3*time.Hour)
	f.age(t, newDone.ID, 30*time.Minute)
	f.age(t, oldDead.ID, 11*time.Hour)
	f.age(t, newDead.ID, 3*time.Hour)
	f.age(t, running.ID, 30*24*time.Hour)
	f.age(t, waiting.ID, 30*24*time.Hour)
	f.age(t, replay.Job.ID, 30*24*time.Hour)

	// Outbox: the old succeeded job's events were published two days ago,
	// the new one's an hour ago.
	f.exec(t, `UPDATE %s.outbox SET published_at = now() - interval '2 days' WHERE aggregate_id = $1`, oldDone.ID)
	f.exec(t, `UPDATE %s.outbox SET published_at = now() - interval '1 hour' WHERE aggregate_id = $1`, newDone.ID)
	// Inbox ids received 8 days and 1 day ago.
	f.exec(t, `INSERT INTO %s.inbox (consumer, message_id, payload_digest, received_at) VALUES
		('c', 'old', 'd', now() - interval '8 days'), ('c', 'new', 'd', now() - interval '1 day')`)
	// Quarantined messages received 31 days and 1 day ago.
	f.exec(t, `INSERT INTO %s.inbox_quarantine (consumer, payload_digest, reason, received_at) VALUES
		('c', 'd', 'poison', now() - interval '31 days'), ('c', 'd', 'poison', now() - interval '1 day')`)
	// Webhook deliveries created 31 days and 1 day ago, with an attempt each.
	endpoint := uuid.New()
	f.exec(t, `INSERT INTO %s.webhook_endpoints (id, tenant, url, event_types) VALUES ($1, 'acme', 'https://example.com', '{*}')`, endpoint)
	f.exec(t, `INSERT INTO %s.webhook_deliveries (id, tenant, endpoint_id, event_id, event_type, body, created_at) VALUES
		(gen_random_uuid(), 'acme', $1, 'e-old', 't', '', now() - interval '31 days'),
		(gen_random_uuid(), 'acme', $1, 'e-new', 't', '', now() - interval '1 day')`, endpoint)
	f.exec(t, `INSERT INTO %s.webhook_attempts (delivery_id, job_id, attempt, url, started_at, latency_ms, outcome, key_ids, request_headers)
		SELECT id, gen_random_uuid(), 1, 'u', now(), 1, 'delivered', '{}', '{}' FROM %[1]s.webhook_deliveries`)
	// A pool with two permits in flight, one of them expired.
	f.exec(t, `INSERT INTO %s.admission_pools (name, rpm, tpm, max_in_flight, request_burst, token_burst, request_level, token_level, in_flight, in_flight_tokens)
		VALUES ('p', 60, 1000, 10, 60, 1000, 60, 1000, 2, 2)`)
	f.exec(t, `INSERT INTO %s.admission_permits (id, pool, tokens, expires_at) VALUES
		(gen_random_uuid(), 'p', 1, now() - interval '1 minute'), (gen_random_uuid(), 'p', 1, now() + interval '1 hour')`)

	attemptsBefore, keysBefore, eventsBefore := f.count(t, "job_attempts"), f.count(t, "job_keys"), f.count(t, "outbox")
	svc := f.service(t, retention.Config{Policy: retention.Policy{
		Succeeded: time.Hour, FailedTerminal: 10 * time.Hour, IdempotencyWindow: time.Hour,
	}})

	due, err := svc.Due(ctx)
	require.NoError(t, err)
	require.Contains(t, due, retention.Count{Table: "jobs", Class: "SUCCEEDED", Rows: 1})
	require.Contains(t, due, retention.Count{Table: "jobs", Class: "FAILED_TERMINAL", Rows: 1})
	require.Contains(t, due, retention.Count{Table: "admission_permits", Class: "expired", Rows: 1})
	require.Contains(t, due, retention.Count{Table: "inbox_quarantine", Rows: 1})
	require.Equal(t, attemptsBefore, f.count(t, "job_attempts"), "a dry run deletes nothing")

	pass, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []retention.Count{
		{Table: "jobs", Class: "SUCCEEDED", Rows: 1},
		{Table: "jobs", Class: "FAILED_TERMINAL", Rows: 1},
		{Table: "job_attempts", Rows: 2},
		{Table: "job_keys", Rows: 2},
		{Table: "outbox", Class: "published", Rows: 2}, // requested and completed events
		{Table: "inbox", Rows: 1},
		{Table: "inbox_quarantine", Rows: 1},
		{Table: "webhook_deliveries", Rows: 1},
		{Table: "admission_permits", Class: "expired", Rows: 1},
	}, pass.Deleted)
	require.Equal(t, 1, f.count(t, "inbox_quarantine WHERE received_at > now() - interval '2 days'"), "the recent quarantined message survives")

	require.False(t, f.exists(t, oldDone.ID))
	require.False(t, f.exists(t, oldDead.ID))
	for _, j := range []*jobs.Job{newDone, newDead, running, waiting, replay.Job} {
		require.True(t, f.exists(t, j.ID), "job %s survives", j.ID)
	}
	require.Equal(t, attemptsBefore-2, f.count(t, "job_attempts"))
	require.Equal(t, keysBefore-2, f.count(t, "job_keys"), "the replay's key survives with the replay")
	require.Equal(t, eventsBefore-2, f.count(t, "outbox"))
	require.Equal(t, 1, f.count(t, "inbox"))
	require.Equal(t, 1, f.count(t, "webhook_deliveries"))
	require.Equal(t, 1, f.count(t, "webhook_attempts"), "attempts follow their delivery")
	require.Equal(t, 1, f.count(t, "admission_permits"))
	var inFlight, inFlightTokens int
	require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT in_flight, in_flight_tokens FROM "+f.db.Schema+".admission_pools").Scan(&inFlight, &inFlightTokens))
	require.Equal(t, 1, inFlight, "a reaped permit's slot is handed back")
	require.Equal(t, 1, inFlightTokens, "and its reserved tokens")
	got, err := f.store.Get(ctx, f.db.Pool, "acme", replay.Job.ID)
	require.NoError(t, err)
	require.Equal(t, uuid.Nil, got.ReplayOf, "a replay outlives the job it replayed, unlinked")

	// Inside the window a retry returns the old job; after it the key
	// accepts a new one.
	again, err := f.store.Enqueue(ctx, f.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: "new-key"})
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, newDone.ID, again.Job.ID)
	fresh, err := f.store.Enqueue(ctx, f.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: "old-key"})
	require.NoError(t, err)
	require.False(t, fresh.Existing)
	require.NotEqual(t, oldDone.ID, fresh.Job.ID)

	// A second pass finds nothing.
	pass, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Total())

	st, err := svc.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, svc.ID(), st.Holder)
	require.NotNil(t, st.Policy)
	require.Equal(t, time.Hour, st.Policy.Succeeded)
	require.Equal(t, retention.Never, st.Policy.UnrelayedEvents)
	require.NotNil(t, st.LastPass)
	require.Contains(t, st.Oldest, retention.Oldest{Table: "jobs", Class: "CANCELLED"})
}

// The idempotency window is a floor under every state's retention: a job
// finished longer ago than its state's retention but accepted inside the
// window keeps its key, and a retry gets the old job; once the window has
// passed and the job is pruned, the same retry creates a new job.
func TestIdempotencyWindowKeepsKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	j := f.enqueue(t, "key")
	f.finish(t, jobs.OutcomeSucceeded)
	f.age(t, j.ID, 2*time.Hour)
	svc := f.service(t, retention.Config{Policy: retention.Policy{Succeeded: time.Hour, IdempotencyWindow: 3 * time.Hour}})
	_, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	again, err := f.store.Enqueue(ctx, f.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: "key"})
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, j.ID, again.Job.ID)

	f.age(t, j.ID, 4*time.Hour)
	_, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.False(t, f.exists(t, j.ID))
	// Past the window the key is free: the same call accepts a new job.
	fresh, err := f.store.Enqueue(ctx, f.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: "key"})
	require.NoError(t, err)
	require.False(t, fresh.Existing)
	require.NotEqual(t, j.ID, fresh.Job.ID)
}

// finishedBacklog makes n succeeded jobs finished two days ago.
func (f *fixture) finishedBacklog(t *testing.T, n int) {
	t.Helper()
	params := make([]jobs.EnqueueParams, n)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: fmt.Sprint("k", i)}
	}
	for start := 0; start < n; start += jobs.MaxBatch {
		_, err := f.store.EnqueueMany(t.Context(), f.db.Pool, params[start:min(n, start+jobs.MaxBatch)])
		require.NoError(t, err)
	}
	for f.count(t, "jobs WHERE state = 'READY'") > 0 {
		f.finish(t, jobs.OutcomeSucceeded)
	}
	f.exec(t, `UPDATE %s.jobs SET finished_at = now() - interval '2 days', created_at = now() - interval '2 days'`)
}

// Of several services on one schema, one prunes at a time: each batch
// runs under the lease's row lock, so no two batches are ever in flight
// together, and the work still gets done.
func TestTwoServicesNeverPruneAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.finishedBacklog(t, 1500)

	var inBatch, overlaps, batches atomic.Int64
	holders := sync.Map{}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	runErrs := make(chan error, 3)
	for i := range 3 {
		svc := f.service(t, retention.Config{ID: fmt.Sprint("svc-", i), Interval: 20 * time.Millisecond, BatchSize: 50})
		retention.SetBeforeCommit(svc, func(pgx.Tx) {
			if inBatch.Add(1) > 1 {
				overlaps.Add(1)
			}
			holders.Store(svc.ID(), true)
			batches.Add(1)
			time.Sleep(time.Millisecond) // widen the window a second pruner would need
			inBatch.Add(-1)
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			runErrs <- svc.Run(ctx)
		}()
	}
	require.Eventually(t, func() bool { return f.count(t, "jobs") == 0 }, 30*time.Second, 20*time.Millisecond)
	cancel()
	wg.Wait()
	close(runErrs)
	for err := range runErrs {
		require.NoError(t, err)
	}
	require.Zero(t, overlaps.Load(), "two batches ran at once")
	require.GreaterOrEqual(t, batches.Load(), int64(30))
	require.Zero(t, f.count(t, "job_keys"))
	require.Zero(t, f.count(t, "job_attempts"))
	var holder *string
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT holder FROM "+f.db.Schema+".retention_lease").Scan(&holder))
	require.Nil(t, holder, "Run releases the lease when it ends")
}

// A holder that lost its lease (paused past it) deletes nothing more:
// its next batch finds the lease no longer its own, and another process
// takes over.
func TestLostLeaseStopsThePass(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.finishedBacklog(t, 300)
	a := f.service(t, retention.Config{ID: "a", BatchSize: 100})
	b := f.service(t, retention.Config{ID: "b", BatchSize: 100})
	retention.SetBeforeCommit(a, func(tx pgx.Tx) {
		// As if a were paused past its lease right after this batch.
		_, err := tx.Exec(context.Background(), "UPDATE "+f.db.Schema+".retention_lease SET lease_until = now() - interval '1 second'")
		require.NoError(t, err)
	})
	pass, err := a.PruneOnce(t.Context())
	require.ErrorIs(t, err, retention.ErrNotHolder)
	require.Equal(t, 1, pass.Batches)
	require.Equal(t, 200, f.count(t, "jobs"), "only the batch under the lease was deleted")

	pass, err = b.PruneOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(200), pass.Deleted[0].Rows)
	_, err = a.PruneOnce(t.Context())
	require.ErrorIs(t, err, retention.ErrNotHolder, "b holds the lease now")
}

// A crash in the middle of a batch (the session dies before the commit)
// loses nothing: the batch's deletes of jobs, attempts and keys roll back
// together, and the next pass deletes exactly what was due.
func TestCrashMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.finishedBacklog(t, 200)
	keep := f.enqueue(t, "keep")
	svc := f.service(t, retention.Config{BatchSize: 150})
	jobsBefore, attemptsBefore, keysBefore := f.count(t, "jobs"), f.count(t, "job_attempts"), f.count(t, "job_keys")

	retention.SetBeforeCommit(svc, func(tx pgx.Tx) {
		var pid int
		require.NoError(t, tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
		_, err := f.db.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
	})
	_, err := svc.PruneOnce(t.Context())
	require.Error(t, err)
	require.Equal(t, jobsBefore, f.count(t, "jobs"))
	require.Equal(t, attemptsBefore, f.count(t, "job_attempts"))
	require.Equal(t, keysBefore, f.count(t, "job_keys"))

	retention.SetBeforeCommit(svc, nil)
	// The ended session's row lock on the lease goes when PostgreSQL has
	// finished ending it, a moment after the client saw the failure; until
	// then the lease reads as busy.
	var pass retention.Pass
	require.Eventually(t, func() bool {
		pass, err = svc.PruneOnce(t.Context())
		require.True(t, err == nil || errors.Is(err, retention.ErrNotHolder), "%v", err)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, retention.Count{Table: "jobs", Class: "SUCCEEDED", Rows: 200}, pass.Deleted[0])
	require.Equal(t, 1, f.count(t, "jobs"))
	require.True(t, f.exists(t, keep.ID))
	require.Equal(t, 0, f.count(t, "job_attempts"))
	require.Equal(t, 1, f.count(t, "job_keys"))
}

// Bad configuration is refused with a ConfigError naming the field
// (matching ErrInvalidConfig) before anything runs.
func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	for field, cfg := range map[string]retention.Config{
		"Policy.Succeeded":         {Policy: retention.Policy{Succeeded: -2}},
		"Policy.IdempotencyWindow": {Policy: retention.Policy{IdempotencyWindow: retention.Never}},
		"Policy.InboxRecords":      {Policy: retention.Policy{InboxRecords: time.Minute}},
		"Policy.InboxQuarantine":   {Policy: retention.Policy{InboxQuarantine: -time.Hour}},
		"Policy.WebhookDeliveries": {Policy: retention.Policy{WebhookDeliveries: 24 * time.Hour}},
		"BatchSize":                {BatchSize: retention.MaxBatchSize + 1},
		"Interval":                 {Interval: -time.Second},
		"Lease":                    {Interval: time.Minute, Lease: time.Second},
		"BatchPause":               {Interval: time.Second, Lease: 4 * time.Second, BatchPause: 2 * time.Second},
		"Schema":                   {Schema: "Bad-Schema"},
	} {
		_, err := retention.New(db.Pool, cfg)
		require.ErrorIs(t, err, retention.ErrInvalidConfig, field)
		var ce *retention.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.Contains(t, err.Error(), field)
	}
	for _, ok := range []retention.Config{
		{Interval: time.Second, Lease: 4 * time.Second, BatchPause: time.Second},
		{Policy: retention.Policy{WebhookDeliveries: webhook.RetentionFloor(nil)}},
		{Policy: retention.Policy{WebhookDeliveries: retention.Never, InboxQuarantine: retention.Never}},
	} {
		_, err := retention.New(db.Pool, ok)
		require.NoError(t, err, "%+v", ok)
	}
	_, err := retention.New(nil, retention.Config{})
	require.ErrorIs(t, err, retention.ErrInvalidConfig)
	svc, err := retention.New(db.Pool, retention.Config{Policy: retention.Policy{Succeeded: retention.Never}})
	require.NoError(t, err)
	require.Equal(t, retention.Never, svc.Policy().Job(jobs.StateSucceeded))
	require.Equal(t, retention.DefaultFailedTerminal, svc.Policy().Job(jobs.StateFailedTerminal))
	require.Equal(t, retention.Never, svc.Policy().Job(jobs.StateRunning))
}

// On a host that runs no relay and leaves its events to retention,
// unpublished events past UnrelayedEvents are deleted; on a schema where a
// relay has ever held the leader lease (holding it, lapsed, or released
// cleanly), none is.
func TestUnrelayedEventsWaitForNoRelay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	old, recent := f.enqueue(t, ""), f.enqueue(t, "")
	f.exec(t, `UPDATE %s.outbox SET created_at = now() - interval '3 hours' WHERE aggregate_id = $1`, old.ID)
	f.exec(t, `UPDATE %s.outbox_relay_lease SET holder = 'relay-1', lease_epoch = 1, lease_until = now() + interval '1 minute'`)
	svc := f.service(t, retention.Config{Policy: retention.Policy{UnrelayedEvents: time.Hour}})

	pass, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Total(), "a relay holds the lease: its events are its own")
	f.exec(t, `UPDATE %s.outbox_relay_lease SET lease_until = now() - interval '30 minutes'`)
	pass, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Total(), "the relay held the lease within the retention")
	// What a relay leaves when it stops cleanly (ReleaseLease): its name,
	// its epoch and no time. It may be restarting: its events stay.
	f.exec(t, `UPDATE %s.outbox_relay_lease SET lease_until = '-infinity'`)
	pass, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Total(), "a relay released the lease: it may be restarting")
	f.exec(t, `UPDATE %s.outbox_relay_lease SET holder = NULL`)
	pass, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Total(), "a relay has run on this schema (epoch 1)")

	f.exec(t, `UPDATE %s.outbox_relay_lease SET holder = NULL, lease_epoch = 0, lease_until = '-infinity'`)
	due, err := svc.Due(ctx)
	require.NoError(t, err)
	require.Contains(t, due, retention.Count{Table: "outbox", Class: "unpublished", Rows: 1}, "the dry run shows what the pass deletes")
	pass, err = svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []retention.Count{{Table: "outbox", Class: "unpublished", Rows: 1}}, pass.Deleted)
	var left int
	require.NoError(t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE aggregate_id = $1", recent.ID).Scan(&left))
	require.Equal(t, 1, left, "a recent unpublished event stays")

	// By default unpublished events are kept.
	require.NoError(t, svc.Release(ctx))
	f.exec(t, `UPDATE %s.outbox SET created_at = now() - interval '300 days'`)
	pass, err = f.service(t, retention.Config{}).PruneOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Total())
}

// A finished batch's row is kept for the longest retention of the finished
// states, so it outlives every job it counted; an open batch is kept
// however old; and a state kept forever keeps every batch.
func TestPruneKeepsBatchesAsLongAsTheirLongestLivedJobs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	batch := func(key string) *jobs.Batch {
		t.Helper()
		res, err := f.store.EnqueueBatch(ctx, f.db.Pool, jobs.EnqueueBatchParams{Tenant: "acme", Key: key, Jobs: []jobs.EnqueueParams{{Kind: "k", Payload: []byte(`{}`)}}})
		require.NoError(t, err)
		return res.Batch
	}
	old, recent := batch("old"), batch("recent")
	f.exec(t, `UPDATE %s.jobs SET state = 'CANCELLED', finished_at = now() WHERE batch_id IN ($1, $2)`, old.ID, recent.ID)
	f.exec(t, `UPDATE %s.job_batches SET finished = 1, cancelled = 1, finished_at = now() - interval '5 hours' WHERE id = $1`, old.ID)
	f.exec(t, `UPDATE %s.job_batches SET finished = 1, cancelled = 1, finished_at = now() - interval '3 hours' WHERE id = $1`, recent.ID)
	open := batch("open")
	f.exec(t, `UPDATE %s.job_batches SET created_at = now() - interval '30 days' WHERE id = $1`, open.ID)

	policy := retention.Policy{Succeeded: time.Hour, Cancelled: 2 * time.Hour, ReviewRequired: 3 * time.Hour, FailedTerminal: 4 * time.Hour, IdempotencyWindow: time.Hour}
	require.Equal(t, 4*time.Hour, policy.Batches())
	forever := policy
	forever.ReviewRequired = retention.Never
	require.Equal(t, retention.Never, forever.Batches())

	svc := f.service(t, retention.Config{Policy: policy})
	due, err := svc.Due(ctx)
	require.NoError(t, err)
	require.Contains(t, due, retention.Count{Table: "job_batches", Rows: 1})
	pass, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Contains(t, pass.Deleted, retention.Count{Table: "job_batches", Rows: 1})
	_, err = f.store.Batch(ctx, f.db.Pool, "acme", old.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound, "finished 5h ago, past the longest retention (4h)")
	for _, b := range []*jobs.Batch{recent, open} {
		_, err = f.store.Batch(ctx, f.db.Pool, "acme", b.ID)
		require.NoError(t, err, "batch %s survives", b.Key)
	}
}

// A pass prunes every published event that is due, batch rows (many
// events in one row, outbox.Store.WriteBatch) among them, in as many
// batches as it takes: a batch of batch rows deletes more events than its
// limit, and one whose rows were all split out deletes none, and neither
// ends the class while rows are left.
func TestPruneDrainsBatchRowsOfEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	events, err := outbox.NewStore(outbox.Config{Schema: f.db.Schema})
	require.NoError(t, err)
	ev := outbox.Event{Topic: "t", Type: "x", Payload: []byte(`{}`)}
	for range 10 {
		_, err := events.Write(ctx, f.db.Pool, ev)
		require.NoError(t, err)
		_, err = events.WriteBatch(ctx, f.db.Pool, []outbox.Event{ev, ev, ev})
		require.NoError(t, err)
	}
	f.exec(t, `UPDATE %s.outbox SET published_at = now() - interval '2 days'`)
	f.exec(t, `UPDATE %s.outbox_batches SET published_at = now() - interval '2 days'`)
	// Two rows whose events were all split out (their copies are the
	// single-event rows above, as far as pruning goes): they count none.
	f.exec(t, `UPDATE %s.outbox_batches SET split = ARRAY[first_seq, first_seq + 1, first_seq + 2] WHERE first_seq IN (
		SELECT first_seq FROM %[1]s.outbox_batches ORDER BY first_seq LIMIT 2)`)

	pass, err := f.service(t, retention.Config{BatchSize: 4, Policy: retention.Policy{PublishedEvents: time.Hour}}).PruneOnce(ctx)
	require.NoError(t, err)
	require.Contains(t, pass.Deleted, retention.Count{Table: "outbox", Class: "published", Rows: 10 + 8*3})
	require.Zero(t, f.count(t, "outbox"))
	require.Zero(t, f.count(t, "outbox_batches"))
}

// A reuse invalidation is kept until no result it covers can be reused:
// the succeeded jobs' retention (at most the longest reuse TTL) and a week
// for the longest attempt; then a pass prunes it, and a dry run counts it.
func TestPruneKeepsReuseInvalidationsWhileTheirResultsCanBeReused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	invalidate := func(age string) int64 {
		t.Helper()
		inv, _, err := f.store.InvalidateReuse(t.Context(), f.db.Pool, jobs.InvalidateReuseParams{Kind: "k", By: "ops", Reason: age})
		require.NoError(t, err)
		f.exec(t, `UPDATE %s.job_reuse_invalidations SET invalidated_at = now() - $1::interval WHERE id = $2`, age, inv.ID)
		return inv.ID
	}
	invalidate("8 days")
	kept := invalidate("6 days")

	policy := retention.Policy{Succeeded: time.Hour, Cancelled: time.Hour, ReviewRequired: time.Hour, FailedTerminal: time.Hour, IdempotencyWindow: time.Hour}
	require.Equal(t, 7*24*time.Hour+time.Hour, jobs.ReuseInvalidationRetention(policy.Succeeded))
	require.Equal(t, jobs.MaxReuseTTL+7*24*time.Hour, jobs.ReuseInvalidationRetention(retention.Never))
	svc := f.service(t, retention.Config{Policy: policy})
	due, err := svc.Due(ctx)
	require.NoError(t, err)
	require.Contains(t, due, retention.Count{Table: "job_reuse_invalidations", Rows: 1})
	pass, err := svc.PruneOnce(ctx)
	require.NoError(t, err)
	require.Contains(t, pass.Deleted, retention.Count{Table: "job_reuse_invalidations", Rows: 1})
	left, err := f.store.ReuseInvalidations(ctx, f.db.Pool, "", 10)
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, kept, left[0].ID)
}
