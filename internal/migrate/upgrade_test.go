package migrate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/migrate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// populatedVersion is the schema version TestUpgradeKeepsEverything fills
// with data before upgrading: the version before storage v2's changes.
const populatedVersion = 12

// Job ids of the populated schema, by what they are at populatedVersion.
var (
	readyKeyed     = uuid.MustParse("00000000-0000-7000-8000-000000000001")
	groupFirst     = uuid.MustParse("00000000-0000-7000-8000-000000000002")
	groupSecond    = uuid.MustParse("00000000-0000-7000-8000-000000000003")
	readyDeadline  = uuid.MustParse("00000000-0000-7000-8000-000000000004")
	retryScheduled = uuid.MustParse("00000000-0000-7000-8000-000000000005")
	runningExpired = uuid.MustParse("00000000-0000-7000-8000-000000000006")
	runningLive    = uuid.MustParse("00000000-0000-7000-8000-000000000007")
	succeeded      = uuid.MustParse("00000000-0000-7000-8000-000000000008")
	failed         = uuid.MustParse("00000000-0000-7000-8000-000000000009")
	cancelled      = uuid.MustParse("00000000-0000-7000-8000-00000000000a")
	review         = uuid.MustParse("00000000-0000-7000-8000-00000000000b")
)

// populateSQL fills a schema at populatedVersion (/*schema*/ is replaced):
// jobs in every state (one of each group of a group key, a deadline, an
// expired and a live lease), their attempts and keys, unpublished and
// published events, active and idle tenants, tenant limits and a provider
// pool. Written as SQL of that version, since today's code writes
// columns it did not have.
const populateSQL = `
INSERT INTO /*schema*/jobs (id, tenant, kind, queue, idempotency_key, request_hash, payload, group_key,
    state, attempt, max_attempts, fence, lease_owner, lease_until, attempted_at, available_at, deadline_at,
    state_version, result, error_class, last_error, finished_at) VALUES
('00000000-0000-7000-8000-000000000001', 'acme',   'k', 'default', 'key-1', 'h1', '{"n":1}', NULL, 'READY',           0, 5, 0, NULL, NULL, NULL, now() - interval '1 minute', NULL, 1, NULL, NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000002', 'acme',   'k', 'default', NULL, NULL,     '{"n":2}', 'g',  'READY',           0, 5, 0, NULL, NULL, NULL, now() - interval '1 minute', NULL, 1, NULL, NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000003', 'acme',   'k', 'default', NULL, NULL,     '{"n":3}', 'g',  'READY',           0, 5, 0, NULL, NULL, NULL, now() - interval '1 minute', NULL, 1, NULL, NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000004', 'globex', 'k', 'default', NULL, NULL,     '{"n":4}', NULL, 'READY',           0, 5, 0, NULL, NULL, NULL, now() - interval '1 minute', now() + interval '1 hour', 1, NULL, NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000005', 'globex', 'k', 'default', NULL, NULL,     '{"n":5}', NULL, 'RETRY_SCHEDULED', 1, 5, 2, 'old-w', NULL, now() - interval '2 minutes', now() - interval '1 second', NULL, 3, NULL, 'transient', 'flaky', NULL),
('00000000-0000-7000-8000-000000000006', 'acme',   'k', 'default', NULL, NULL,     '{"n":6}', NULL, 'RUNNING',         1, 5, 1, 'old-w', now() - interval '1 second', now() - interval '2 minutes', now() - interval '2 minutes', NULL, 2, NULL, NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000007', 'globex', 'k', 'default', NULL, NULL,     '{"n":7}', NULL, 'RUNNING',         1, 5, 1, 'old-live', now() + interval '1 hour', now() - interval '1 second', now() - interval '1 minute', NULL, 2, NULL, NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000008', 'acme',   'k', 'default', 'key-8', 'h8', '{"n":8}', NULL, 'SUCCEEDED',       1, 5, 2, 'old-w', NULL, now() - interval '3 minutes', now() - interval '3 minutes', NULL, 3, '{"ok":8}', NULL, NULL, now() - interval '2 minutes'),
('00000000-0000-7000-8000-000000000009', 'acme',   'k', 'default', NULL, NULL,     '{"n":9}', NULL, 'FAILED_TERMINAL', 1, 1, 2, 'old-w', NULL, now() - interval '3 minutes', now() - interval '3 minutes', NULL, 3, NULL, 'fatal', 'boom', now() - interval '2 minutes'),
('00000000-0000-7000-8000-00000000000a', 'globex', 'k', 'default', NULL, NULL,     '{"n":10}', NULL, 'CANCELLED',      0, 5, 0, NULL, NULL, NULL, now() - interval '3 minutes', NULL, 2, NULL, NULL, NULL, now() - interval '2 minutes'),
('00000000-0000-7000-8000-00000000000b', 'globex', 'k', 'default', NULL, NULL,     '{"n":11}', NULL, 'REVIEW_REQUIRED', 1, 5, 2, 'old-w', NULL, now() - interval '3 minutes', now() - interval '3 minutes', NULL, 3, '{"draft":1}', NULL, NULL, now() - interval '2 minutes');

INSERT INTO /*schema*/job_keys (tenant, id, idempotency_key)
SELECT tenant, id, idempotency_key FROM /*schema*/jobs;

INSERT INTO /*schema*/job_attempts (job_id, attempt, fence, worker, started_at, outcome, error_class, error, retry_at) VALUES
('00000000-0000-7000-8000-000000000005', 1, 1, 'old-w', now() - interval '2 minutes', 'retry_scheduled', 'transient', 'flaky', now() - interval '1 second'),
('00000000-0000-7000-8000-000000000008', 1, 1, 'old-w', now() - interval '3 minutes', 'succeeded', NULL, NULL, NULL),
('00000000-0000-7000-8000-000000000009', 1, 1, 'old-w', now() - interval '3 minutes', 'failed', 'fatal', 'boom', NULL),
('00000000-0000-7000-8000-00000000000b', 1, 1, 'old-w', now() - interval '3 minutes', 'review_required', NULL, NULL, NULL);

-- Every job's requested event, the finished ones' terminal events; those
-- of the finished jobs published, one of them (8's completion) not yet.
INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload, published_at)
SELECT gen_random_uuid(), id, 'llmq.jobs', id::text, 'k.requested', jsonb_build_object('job_id', id),
    CASE WHEN finished_at IS NOT NULL THEN now() - interval '1 minute' END
FROM /*schema*/jobs ORDER BY 2;
INSERT INTO /*schema*/outbox (event_id, aggregate_id, topic, key, event_type, payload, published_at)
SELECT gen_random_uuid(), id, 'llmq.jobs', id::text, 'k.' || lower(state), jsonb_build_object('job_id', id),
    CASE WHEN id <> '00000000-0000-7000-8000-000000000008' THEN now() - interval '1 minute' END
FROM /*schema*/jobs WHERE finished_at IS NOT NULL ORDER BY 2;

INSERT INTO /*schema*/tenant_queues (queue, tenant, vtime, idle) VALUES
('default', 'acme', 3, false),
('default', 'globex', 1, true);
INSERT INTO /*schema*/tenant_limits (tenant, weight, max_running) VALUES ('globex', 2, 5);
INSERT INTO /*schema*/admission_pools (name, rpm, tpm, max_in_flight, request_burst, token_burst, request_level, token_level)
VALUES ('provider', 60, 100000, 4, 60, 100000, 60, 100000);
`

// An installation at populatedVersion, with work in every state, upgrades
// with migrate Up and loses nothing: every row is there afterwards as it
// was (new columns at their defaults), and today's code runs it to
// completion. The old worker's live lease still completes under its
// fence, the expired one is taken back with its attempt recorded, a group
// still runs in order, the idempotency keys still answer with their jobs,
// and the relay publishes every event left unpublished, old and new.
func TestUpgradeKeepsEverything(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true, MaxConns: 8})
	ctx := t.Context()
	m := migrator(t, db.Schema)
	_, err := m.Up(ctx, db.Pool, populatedVersion)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, strings.ReplaceAll(populateSQL, "/*schema*/", db.Schema+"."))
	require.NoError(t, err)
	before := snapshot(t, db.Pool, db.Schema)

	_, err = m.Up(ctx, db.Pool, 0)
	require.NoError(t, err)
	after := snapshot(t, db.Pool, db.Schema)
	require.Equal(t, before, after, "every row is kept as it was")
	var quiet int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema+".jobs WHERE NOT events").Scan(&quiet))
	require.Zero(t, quiet, "jobs accepted before the upgrade keep their events")

	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)

	// The worker that held a live lease before the upgrade finishes.
	done, err := store.Complete(ctx, db.Pool, []jobs.Completion{{
		Lease: jobs.Lease{JobID: runningLive, Fence: 1}, Attempt: 1, Worker: "old-live",
		Outcome: jobs.OutcomeSucceeded, Result: json.RawMessage(`{"ok":7}`),
	}})
	require.NoError(t, err)
	require.Equal(t, jobs.StateSucceeded, done[0].State)
	// The expired lease is taken back.
	reaped, err := store.Reap(ctx, db.Pool, jobs.ReapParams{Backoff: llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond}})
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Rescheduled)

	started := runToCompletion(t, db.Pool, store, []uuid.UUID{readyKeyed, groupFirst, groupSecond, readyDeadline, retryScheduled, runningExpired})
	require.Less(t, started[groupFirst], started[groupSecond], "the group runs in acceptance order")

	for _, id := range []uuid.UUID{readyKeyed, groupFirst, groupSecond, readyDeadline, retryScheduled, runningExpired, runningLive} {
		j, err := store.Lookup(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StateSucceeded, j.State, "job %s", id)
	}
	// The finished jobs are as they were.
	finished := snapshot(t, db.Pool, db.Schema)["jobs"][7:]
	require.Equal(t, before["jobs"][7:], finished)

	// Attempt history: the old rows, then today's.
	for id, want := range map[uuid.UUID][]jobs.AttemptOutcome{
		retryScheduled: {jobs.AttemptRetryScheduled, jobs.AttemptSucceeded},
		runningExpired: {jobs.AttemptLeaseExpired, jobs.AttemptSucceeded},
		runningLive:    {jobs.AttemptSucceeded},
		succeeded:      {jobs.AttemptSucceeded},
		failed:         {jobs.AttemptFailed},
		review:         {jobs.AttemptReviewRequired},
		cancelled:      nil,
	} {
		j, err := store.Lookup(ctx, db.Pool, id)
		require.NoError(t, err)
		attempts, err := store.Attempts(ctx, db.Pool, j.Tenant, id)
		require.NoError(t, err)
		var got []jobs.AttemptOutcome
		for _, a := range attempts {
			got = append(got, a.Outcome)
		}
		require.Equal(t, want, got, "attempts of %s", id)
	}

	// The keys still answer with their jobs, finished or not.
	for id, p := range map[uuid.UUID]jobs.EnqueueParams{
		readyKeyed: {Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{"n":1}`), IdempotencyKey: "key-1", RequestHash: "h1"},
		succeeded:  {Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{"n":8}`), IdempotencyKey: "key-8", RequestHash: "h8"},
	} {
		res, err := store.Enqueue(ctx, db.Pool, p)
		require.NoError(t, err)
		require.True(t, res.Existing)
		require.Equal(t, id, res.Job.ID)
	}

	relayEverything(t, db.Pool, db.Schema)
}

func migrator(t *testing.T, schema string) *migrate.Migrator {
	t.Helper()
	s, err := dbsql.NewSchema(schema)
	require.NoError(t, err)
	m, err := migrate.New(s)
	require.NoError(t, err)
	return m
}

// snapshot reads every row of the populated tables as JSON, in key order,
// leaving out the columns the upgrade added.
func snapshot(t *testing.T, pool *pgxpool.Pool, schema string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for table, order := range map[string]string{
		"jobs": "id", "job_keys": "tenant, id", "job_attempts": "job_id, attempt", "outbox": "seq",
		"tenant_queues": "queue, tenant", "tenant_limits": "tenant", "admission_pools": "name",
	} {
		rows, err := pool.Query(t.Context(), fmt.Sprintf("SELECT (to_jsonb(t) - 'events' - 'batch_id' - 'in_flight_tokens' - 'max_in_flight_tokens' - 'batch_input_price' - 'batch_output_price' - 'reuse_key' - 'reuse_shared' - 'reuse_ttl_ms' - 'reused_from' - 'candidate' - 'model' - 'moves')::text FROM %s.%s AS t ORDER BY %s", schema, table, order))
		require.NoError(t, err)
		out[table], err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NotEmpty(t, out[table], table)
	}
	return out
}

// runToCompletion runs a runner until each of want has succeeded, and
// returns when each one's handler started.
func runToCompletion(t *testing.T, pool *pgxpool.Pool, store *jobs.PostgresStore, want []uuid.UUID) map[uuid.UUID]time.Time {
	t.Helper()
	var mu sync.Mutex
	started := map[uuid.UUID]time.Time{}
	left := map[uuid.UUID]bool{}
	for _, id := range want {
		left[id] = true
	}
	allDone := make(chan struct{})
	r, err := lease.NewRunner(pool, store, lease.Config{
		Handlers: map[string]lease.Handler{"k": lease.HandlerFunc(func(_ context.Context, j *jobs.Job) (json.RawMessage, error) {
			mu.Lock()
			started[j.ID] = time.Now()
			mu.Unlock()
			return json.RawMessage(`{"ok":true}`), nil
		})},
		Queues:       map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 4}},
		PollInterval: 20 * time.Millisecond,
		AfterRecord: func(j *jobs.Job, err error) {
			if err != nil || j.State != jobs.StateSucceeded {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if left[j.ID] {
				delete(left, j.ID)
				if len(left) == 0 {
					close(allDone)
				}
			}
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()
	select {
	case <-allDone:
	case <-time.After(time.Minute):
		mu.Lock()
		t.Errorf("jobs not run within a minute: %v", left)
		mu.Unlock()
	}
	cancel()
	require.NoError(t, <-stopped)
	mu.Lock()
	defer mu.Unlock()
	return started
}

// relayEverything publishes every unpublished event to a memory broker
// and checks that each job's events went out in the order they were
// written, the old ones before today's.
func relayEverything(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	ctx := t.Context()
	events, err := outbox.NewStore(outbox.Config{Schema: schema})
	require.NoError(t, err)
	b := memory.New(memory.Config{})
	defer b.Close()
	relay, err := events.NewRelay(pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	// The old single-event rows and today's, and today's batch rows (a
	// completion of several jobs writes one).
	st, err := relay.Stats(ctx)
	require.NoError(t, err)
	pending := int(st.Pending)
	var batchRows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_batches").Scan(&batchRows))
	require.Positive(t, batchRows)
	_, err = relay.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, pending, b.Published("llmq.jobs"))
	st, err = relay.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Pending)

	c := b.Consumer("llmq.jobs")
	defer c.Close()
	byKey := map[string][]string{}
	for range pending {
		d, err := c.Receive(ctx)
		require.NoError(t, err)
		msg := d.Message()
		byKey[msg.Key] = append(byKey[msg.Key], msg.Headers[outbox.HeaderEventType])
		require.NoError(t, d.Ack(ctx))
	}
	// A job accepted before the upgrade: its old requested event first (a
	// lease taken back for a retry writes none).
	require.Equal(t, []string{"k.requested", "k.completed"}, byKey[runningExpired.String()])
	require.Equal(t, []string{"k.requested", "k.completed"}, byKey[readyKeyed.String()])
	require.Equal(t, []string{"k.succeeded"}, byKey[succeeded.String()], "the finished job's unpublished event")
}

// Down from the latest version to populatedVersion restores that version's
// shape: the same columns, indexes (with their definitions) and storage
// options as a schema migrated only that far.
func TestDownRestoresThePreviousShape(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	old := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	_, err := migrator(t, old.Schema).Up(ctx, old.Pool, populatedVersion)
	require.NoError(t, err)
	back := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	m := migrator(t, back.Schema)
	_, err = m.Up(ctx, back.Pool, 0)
	require.NoError(t, err)
	_, err = m.Down(ctx, back.Pool, populatedVersion)
	require.NoError(t, err)
	require.Equal(t, shape(t, old.Pool, old.Schema), shape(t, back.Pool, back.Schema))
}

// shape describes a schema's tables: columns, indexes and reloptions, with
// the schema's name left out.
func shape(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = $1
UNION ALL
SELECT 'index ' || replace(indexdef, $1 || '.', '') FROM pg_indexes WHERE schemaname = $1
UNION ALL
SELECT 'options ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class AS c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'i')
ORDER BY 1`, schema)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for i := range out {
		out[i] = strings.ReplaceAll(out[i], schema+".", "")
	}
	return out
}

// Going back below migration 0021 loses no event still waiting in a batch
// row: each is copied into a single-event row with its seq, id, creation
// time and headers, and an event split out of a published row is not
// copied again. Up again, the relay publishes them in key order.
func TestBatchRowsGoBackToSingleEventRows(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 4})
	ctx := t.Context()
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	events := func(n int, key string) []outbox.Event {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = outbox.Event{AggregateID: runningLive, Topic: "llmq.jobs", Key: key, Type: fmt.Sprintf("e%d", i),
				Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Headers: map[string]string{"h": key}}
		}
		return evs
	}
	published, err := store.WriteBatch(ctx, db.Pool, events(2, "a"))
	require.NoError(t, err)
	waiting, err := store.WriteBatch(ctx, db.Pool, events(3, "b"))
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE "+db.Schema+".outbox_batches SET published_at = now(), split = ARRAY[$1::bigint] WHERE first_seq = $2",
		published[1].Seq, published[0].Seq)
	require.NoError(t, err)

	m := migrator(t, db.Schema)
	_, err = m.Down(ctx, db.Pool, 20)
	require.NoError(t, err)
	rows, err := db.Pool.Query(ctx, "SELECT event_id, seq, key, event_type, payload::text, headers::text FROM "+db.Schema+".outbox ORDER BY seq")
	require.NoError(t, err)
	type single struct {
		ID                         uuid.UUID
		Seq                        int64
		Key, Type, Payload, Header string
	}
	singles, err := pgx.CollectRows(rows, pgx.RowToStructByPos[single])
	require.NoError(t, err)
	require.Len(t, singles, 3, "the waiting row's events, and nothing of the published one")
	for i, s := range singles {
		require.Equal(t, waiting[i].ID, s.ID)
		require.Equal(t, waiting[i].Seq, s.Seq)
		require.Equal(t, "b", s.Key)
		require.Equal(t, fmt.Sprintf("e%d", i), s.Type)
		require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), s.Payload)
		require.JSONEq(t, `{"h":"b"}`, s.Header)
	}

	_, err = m.Up(ctx, db.Pool, 0)
	require.NoError(t, err)
	relayAll(t, store, db.Pool, 3)
}

// relayAll drains the outbox to a memory broker, requires want events
// published, and returns the broker.
func relayAll(t *testing.T, store *outbox.Store, pool *pgxpool.Pool, want int) *memory.Broker {
	t.Helper()
	b := memory.New(memory.Config{})
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	relay, err := store.NewRelay(pool, b.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	res, err := relay.Drain(t.Context())
	require.NoError(t, err)
	require.Equal(t, want, res.Published)
	return b
}

// Batch rows written before migration 0022, as jsonb whose events leave
// out a NULL aggregate or key, are relayed after it turned them into json
// text: every event once, with its key, aggregate, headers and payload,
// and a keyed event an earlier unpublished single-event row of its key
// holds back is split out and published after that row.
func TestJSONBBatchRowsAreRelayedAfterMigration0022(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 4})
	ctx := t.Context()
	m := migrator(t, db.Schema)
	_, err := m.Down(ctx, db.Pool, 21)
	require.NoError(t, err)
	// At version 21: a single-event row of key "a", then one batch row of
	// three events as that version wrote them.
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Schema+`.outbox (event_id, aggregate_id, topic, key, event_type, payload)
		VALUES ('00000000-0000-7000-8000-0000000000a0', $1, 'llmq.jobs', 'a', 'first', '{}')`, runningLive)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, strings.ReplaceAll(`
WITH e AS (SELECT nextval(pg_get_serial_sequence('/*schema*/outbox', 'seq')) AS seq, n FROM generate_series(1, 3) AS n)
INSERT INTO /*schema*/outbox_batches (first_seq, last_seq, event_count, events)
SELECT min(seq), max(seq), 3, jsonb_agg(CASE n
    WHEN 1 THEN jsonb_build_object('seq', seq, 'id', '00000000-0000-7000-8000-0000000000a1', 'topic', 'llmq.jobs', 'type', 'keyed',
        'payload', jsonb_build_object('n', 1, 'none', null), 'aggregate', $1::text, 'key', 'a', 'headers', jsonb_build_object('h', 'x'))
    WHEN 2 THEN jsonb_build_object('seq', seq, 'id', '00000000-0000-7000-8000-0000000000a2', 'topic', 'llmq.jobs', 'type', 'bare',
        'payload', jsonb_build_object('n', 2))
    ELSE jsonb_build_object('seq', seq, 'id', '00000000-0000-7000-8000-0000000000a3', 'topic', 'llmq.jobs', 'type', 'other-key',
        'payload', '[]'::jsonb, 'key', 'b')
    END ORDER BY seq)
FROM e`, "/*schema*/", db.Schema+"."), runningLive)
	require.NoError(t, err)

	_, err = m.Up(ctx, db.Pool, 0)
	require.NoError(t, err)
	var typ string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = 'events'`, db.Schema+".outbox_batches").Scan(&typ))
	require.Equal(t, "json", typ)

	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	b := relayAll(t, store, db.Pool, 4)

	c := b.Consumer("llmq.jobs")
	defer c.Close()
	got := map[string]broker.Message{}
	var keyA []string
	for range 4 {
		d, err := c.Receive(ctx)
		require.NoError(t, err)
		msg := d.Message()
		got[msg.Headers[outbox.HeaderEventType]] = msg
		if msg.Key == "a" {
			keyA = append(keyA, msg.Headers[outbox.HeaderEventType])
		}
		require.NoError(t, d.Ack(ctx))
	}
	require.Equal(t, []string{"first", "keyed"}, keyA, "the single-event row of key a first")
	keyed := got["keyed"]
	require.Equal(t, "00000000-0000-7000-8000-0000000000a1", keyed.ID)
	require.Equal(t, "x", keyed.Headers["h"])
	require.Equal(t, runningLive.String(), keyed.Headers[outbox.HeaderAggregateID])
	require.JSONEq(t, `{"n": 1, "none": null}`, string(keyed.Body))
	bare := got["bare"]
	require.Empty(t, bare.Key)
	require.NotContains(t, bare.Headers, outbox.HeaderAggregateID)
	require.JSONEq(t, `{"n": 2}`, string(bare.Body))
	require.Equal(t, "b", got["other-key"].Key)
	require.JSONEq(t, `[]`, string(got["other-key"].Body))
}

// From migration 0028 a batch row's events are compressed with lz4 on a
// server that has it, and a value written before keeps its compression and
// reads back; down again, new rows use the server's default.
func TestBatchEventsCompressWithLZ4(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	var hasLZ4 bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'`).Scan(&hasLZ4))
	m := migrator(t, db.Schema)
	_, err := m.Up(ctx, db.Pool, 27)
	require.NoError(t, err)
	// A row large enough to be compressed, written with the default.
	insert := func(first int64) {
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Schema+`.outbox_batches (first_seq, last_seq, event_count, events)
SELECT $1::bigint, $1::bigint + 999, 1000, json_agg(json_build_object('seq', $1::bigint + g, 'payload', repeat('abc', 20)))
FROM generate_series(0, 999) AS g`, first)
		require.NoError(t, err)
	}
	method := func(first int64) string {
		var m *string
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT pg_column_compression(events) FROM `+db.Schema+`.outbox_batches WHERE first_seq = $1`, first).Scan(&m))
		require.NotNil(t, m, "the events of row %d are compressed", first)
		return *m
	}
	insert(1)
	_, err = m.Up(ctx, db.Pool, 0)
	require.NoError(t, err)
	insert(2000)
	require.Equal(t, "pglz", method(1), "written before, kept as it was")
	if hasLZ4 {
		require.Equal(t, "lz4", method(2000))
	} else {
		t.Log("this server was built without lz4: its batch rows keep pglz")
		require.Equal(t, "pglz", method(2000))
	}
	var events int
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT sum(json_array_length(events)) FROM `+db.Schema+`.outbox_batches`).Scan(&events))
	require.Equal(t, 2000, events, "both rows read back")

	_, err = m.Down(ctx, db.Pool, 27)
	require.NoError(t, err)
	insert(4000)
	require.Equal(t, "pglz", method(4000), "down again: the server's default")
}
