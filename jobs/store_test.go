package jobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

type fixture struct {
	store  *jobs.PostgresStore
	pool   *pgxpool.Pool
	schema string
}

func setup(t testing.TB, opts ...dbtest.Options) *fixture {
	t.Helper()
	db := dbtest.Setup(t, opts...)
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema, Queues: []string{"default", "webhooks"}})
	require.NoError(t, err)
	return &fixture{store: store, pool: db.Pool, schema: db.Schema}
}

// count returns the number of rows in one of the fixture's tables.
func (f *fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+"."+table).Scan(&n))
	return n
}

// eventCount counts the stored outbox events, in both of the outbox's tables.
func (f *fixture) eventCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+dbtest.OutboxEvents(f.schema, "o")).Scan(&n))
	return n
}

// rawJob returns a job's row as JSON, to compare rows byte for byte.
func (f *fixture) rawJob(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var row string
	require.NoError(t, f.pool.QueryRow(t.Context(),
		"SELECT to_jsonb(j)::text FROM "+f.schema+".jobs j WHERE id = $1", id).Scan(&row))
	return row
}

type outboxRow struct {
	aggregate uuid.UUID
	topic     string
	key       string
	eventType string
	payload   map[string]any
}

func (f *fixture) events(t *testing.T) []outboxRow {
	t.Helper()
	rows, err := f.pool.Query(t.Context(),
		"SELECT aggregate_id, topic, key, event_type, payload FROM "+dbtest.OutboxEvents(f.schema, "o")+" ORDER BY seq")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		err := r.Scan(&o.aggregate, &o.topic, &o.key, &o.eventType, &o.payload)
		return o, err
	})
	require.NoError(t, err)
	return out
}

func invoice(tenant, key, document string) jobs.EnqueueParams {
	return jobs.EnqueueParams{
		Tenant:         tenant,
		Kind:           "invoice.extract",
		Payload:        json.RawMessage(`{"document":"` + document + `","schema":"v3"}`),
		IdempotencyKey: key,
	}
}

func TestEnqueueConcurrentSameKey(t *testing.T) {
	t.Parallel()
	f := setup(t, dbtest.Options{MaxConns: 25})

	const callers = 50
	ids := make([]uuid.UUID, callers)
	existing := make([]bool, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			// Each caller uses its own transaction, as a request handler would.
			errs[i] = pgx.BeginFunc(t.Context(), f.pool, func(tx pgx.Tx) error {
				res, err := f.store.Enqueue(t.Context(), tx, invoice("acme", "upload-42", "doc-1"))
				if err == nil {
					ids[i], existing[i] = res.Job.ID, res.Existing
				}
				return err
			})
		})
	}
	close(start)
	wg.Wait()

	created := 0
	for i := range callers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, ids[0], ids[i], "caller %d got another job", i)
		if !existing[i] {
			created++
		}
	}
	require.Equal(t, 1, created, "exactly one caller created the job")
	require.Equal(t, 1, f.count(t, "jobs"))
	require.Equal(t, 1, f.eventCount(t))
}

func TestEnqueueSameKeyDifferentRequestConflicts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	first, err := f.store.Enqueue(ctx, f.pool, invoice("acme", "upload-1", "doc-1"))
	require.NoError(t, err)
	before := f.rawJob(t, first.Job.ID)

	again, err := f.store.Enqueue(ctx, f.pool, invoice("acme", "upload-1", "doc-1"))
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, first.Job.ID, again.Job.ID)

	_, err = f.store.Enqueue(ctx, f.pool, invoice("acme", "upload-1", "doc-2"))
	require.ErrorIs(t, err, jobs.ErrIdempotencyConflict)
	var conflict *jobs.ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, first.Job.ID, conflict.ExistingJobID)

	require.Equal(t, before, f.rawJob(t, first.Job.ID), "the existing job is unchanged")
	require.Equal(t, 1, f.count(t, "jobs"))
	require.Equal(t, 1, f.eventCount(t), "no second event")

	// Another tenant's identical key is an unrelated job.
	other, err := f.store.Enqueue(ctx, f.pool, invoice("globex", "upload-1", "doc-2"))
	require.NoError(t, err)
	require.False(t, other.Existing)
	require.NotEqual(t, first.Job.ID, other.Job.ID)
}

// A key lives as long as its job_keys row: a job pruned together with
// that row frees its key; a job deleted without it leaves the key taken,
// and enqueueing it again says so.
func TestPrunedJobsAndTheirKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	prune := func(id uuid.UUID, keys bool) {
		t.Helper()
		if keys {
			_, err := f.pool.Exec(ctx, "DELETE FROM "+f.schema+".job_keys WHERE id = $1", id)
			require.NoError(t, err)
		}
		_, err := f.pool.Exec(ctx, "DELETE FROM "+f.schema+".jobs WHERE id = $1", id)
		require.NoError(t, err)
	}

	first, err := f.store.Enqueue(ctx, f.pool, invoice("acme", "upload-1", "doc-1"))
	require.NoError(t, err)
	prune(first.Job.ID, true)
	again, err := f.store.Enqueue(ctx, f.pool, invoice("acme", "upload-1", "doc-1"))
	require.NoError(t, err)
	require.False(t, again.Existing, "pruned with its key, the key is free")

	prune(again.Job.ID, false)
	_, err = f.store.Enqueue(ctx, f.pool, invoice("acme", "upload-1", "doc-1"))
	require.ErrorContains(t, err, "deleted without its job_keys row")
}

func TestEnqueueCommitsWithTheCallersTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = f.store.Enqueue(ctx, tx, invoice("acme", "k1", "doc-1"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, f.count(t, "jobs"), "rolled back: no job")
	require.Zero(t, f.eventCount(t), "rolled back: no event")

	tx, err = f.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := f.store.Enqueue(ctx, tx, invoice("acme", "k1", "doc-1"))
	require.NoError(t, err)
	// A conflict inside the caller's transaction writes nothing and leaves
	// the transaction usable.
	_, err = f.store.Enqueue(ctx, tx, invoice("acme", "k1", "doc-other"))
	require.ErrorIs(t, err, jobs.ErrIdempotencyConflict)
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, 1, f.count(t, "jobs"))
	events := f.events(t)
	require.Len(t, events, 1)
	ev := events[0]
	require.Equal(t, res.Job.ID, ev.aggregate)
	require.Equal(t, "invoice.extract.requested", ev.eventType)
	require.Equal(t, jobs.DefaultEventTopic, ev.topic)
	require.Equal(t, res.Job.ID.String(), ev.key)
	require.Equal(t, res.Job.ID.String(), ev.payload["job_id"])
	require.Equal(t, "READY", ev.payload["state"])
}

func TestEnqueueDefaults(t *testing.T) {
	t.Parallel()
	f := setup(t)

	res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "embed"})
	require.NoError(t, err)
	j := res.Job
	require.Equal(t, jobs.StateReady, j.State)
	require.Equal(t, jobs.DefaultQueue, j.Queue)
	require.Equal(t, jobs.DefaultMaxAttempts, j.MaxAttempts)
	require.JSONEq(t, `{}`, string(j.Payload))
	require.Equal(t, int64(1), j.StateVersion)
	require.Zero(t, j.Attempt)
	require.Zero(t, j.Fence)
	require.Empty(t, j.RequestHash, "no key, no hash")
	require.Equal(t, uuid.Version(7), j.ID.Version(), "UUIDv7 ids")
	require.WithinDuration(t, time.Now(), j.AvailableAt, time.Minute)

	// Without an explicit hash, a keyed job hashes its kind and payload.
	keyed, err := f.store.Enqueue(t.Context(), f.pool, invoice("acme", "k", "d"))
	require.NoError(t, err)
	want, err := jobs.RequestHash(map[string]any{"kind": "invoice.extract", "payload": map[string]any{"schema": "v3", "document": "d"}})
	require.NoError(t, err)
	require.Equal(t, want, keyed.Job.RequestHash)
}

func TestEnqueueManyIsAtomic(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	taken, err := f.store.Enqueue(ctx, f.pool, invoice("acme", "taken", "doc-0"))
	require.NoError(t, err)

	batch := []jobs.EnqueueParams{
		invoice("acme", "a", "doc-a"),
		invoice("acme", "b", "doc-b"),
		invoice("acme", "taken", "doc-different"),
	}
	_, err = f.store.EnqueueMany(ctx, f.pool, batch)
	var conflict *jobs.ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, 2, conflict.Index)
	require.Equal(t, 1, f.count(t, "jobs"), "a conflict anywhere writes nothing")
	require.Equal(t, 1, f.eventCount(t))

	// Inside a caller's transaction the batch rolls back to a savepoint:
	// the caller's transaction stays usable.
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.store.EnqueueMany(ctx, tx, batch)
		require.ErrorIs(t, err, jobs.ErrIdempotencyConflict)
		_, err = f.store.Enqueue(ctx, tx, invoice("acme", "c", "doc-c"))
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 2, f.count(t, "jobs"))

	batch[2] = invoice("acme", "taken", "doc-0")
	batch = append(batch, invoice("acme", "a", "doc-a"), jobs.EnqueueParams{Tenant: "acme", Kind: "plain"})
	res, err := f.store.EnqueueMany(ctx, f.pool, batch)
	require.NoError(t, err)
	require.Len(t, res, 5)
	require.False(t, res[0].Existing)
	require.False(t, res[1].Existing)
	require.True(t, res[2].Existing)
	require.Equal(t, taken.Job.ID, res[2].Job.ID)
	require.True(t, res[3].Existing, "a duplicate within the batch resolves to the earlier element")
	require.Equal(t, res[0].Job.ID, res[3].Job.ID)
	require.False(t, res[4].Existing)
	require.Equal(t, 5, f.count(t, "jobs"))
	require.Equal(t, 5, f.eventCount(t), "one event per job created")
}

// Enqueue writes one job with InsertJob, EnqueueMany several with
// InsertJobs: the same job row, key row, requested event and active tenant
// must come out of both, for every field a caller can set, under a trace,
// and for a kind that writes no events.
func TestEnqueueWritesWhatEnqueueManyWrites(t *testing.T) {
	t.Parallel()
	f := setup(t)
	quiet, err := jobs.NewStore(jobs.Config{Schema: f.schema, Queues: []string{"default", "webhooks"}, KindsWithoutEvents: []string{"quiet"}})
	require.NoError(t, err)
	tr := telemetrytest.NewTraces(t)
	ctx, span := tr.Provider.Tracer("test").Start(t.Context(), "accept")
	defer span.End()

	at := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	cases := map[string]jobs.EnqueueParams{
		"defaults": {Kind: "k"},
		"every field": {Kind: "k", Queue: "webhooks", Priority: 3, Payload: json.RawMessage(`{"a":[1,2]}`),
			IdempotencyKey: "key-1", RequestHash: "hash-1", GroupKey: "g", MaxAttempts: 7,
			AvailableAt: at, DeadlineAt: at.Add(time.Hour), EstimatedTokens: 1234},
		"derived hash": {Kind: "k", IdempotencyKey: "key-2", Payload: json.RawMessage(`{"b":true}`)},
		"no events":    {Kind: "quiet"},
	}
	// The row and what went with it, less what differs by construction:
	// the id, the tenant, the times of writing (a default available_at is
	// the time of acceptance).
	written := func(id uuid.UUID) string {
		t.Helper()
		var row string
		require.NoError(t, f.pool.QueryRow(t.Context(), `
			SELECT jsonb_build_object(
				'job', to_jsonb(j) - '{id,tenant,created_at,updated_at,available_at}'::text[]
					|| jsonb_build_object('available_at', CASE WHEN j.available_at = j.created_at THEN 'on acceptance' ELSE j.available_at::text END),
				'key', (SELECT to_jsonb(k) - '{id,tenant}'::text[] FROM `+f.schema+`.job_keys AS k WHERE k.id = j.id),
				'events', (SELECT coalesce(jsonb_agg(jsonb_build_object('topic', e.topic, 'type', e.event_type,
						'key', e.key = j.id::text, 'aggregate', e.aggregate_id = j.id, 'headers', e.headers,
						'payload', e.payload - '{job_id,tenant}'::text[], 'payload_ids', e.payload->>'job_id' = j.id::text AND e.payload->>'tenant' = j.tenant)), '[]')
					FROM `+dbtest.OutboxEvents(f.schema, "e")+` WHERE e.aggregate_id = j.id),
				'active', (SELECT NOT q.idle FROM `+f.schema+`.tenant_queues AS q WHERE q.queue = j.queue AND q.tenant = j.tenant))::text
			FROM `+f.schema+`.jobs AS j WHERE j.id = $1`, id).Scan(&row))
		return row
	}
	for name, p := range cases {
		one, many := p, p
		one.Tenant, many.Tenant = "one-"+name, "many-"+name
		single, err := quiet.Enqueue(ctx, f.pool, one)
		require.NoError(t, err, name)
		batch, err := quiet.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{many, {Tenant: "filler", Kind: "k"}})
		require.NoError(t, err, name)
		require.JSONEq(t, written(batch[0].Job.ID), written(single.Job.ID), name)

		// The job Enqueue returns is the row it wrote.
		stored, err := f.store.Get(t.Context(), f.pool, one.Tenant, single.Job.ID)
		require.NoError(t, err)
		require.Equal(t, stored, single.Job, name)
	}
	var headers int
	require.NoError(t, f.pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+dbtest.OutboxEvents(f.schema, "e")+" WHERE e.headers ? 'traceparent'").Scan(&headers))
	require.Equal(t, 10, f.eventCount(t), "three single jobs, three batched and four fillers write events")
	require.Equal(t, 10, headers, "every event carries the trace")
}

func TestTenantScoping(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	res, err := f.store.Enqueue(ctx, f.pool, invoice("acme", "k", "doc"))
	require.NoError(t, err)
	id := res.Job.ID
	before := f.rawJob(t, id)

	_, err = f.store.Get(ctx, f.pool, "globex", id)
	require.ErrorIs(t, err, jobs.ErrNotFound)
	_, err = f.store.Cancel(ctx, f.pool, "globex", id)
	require.ErrorIs(t, err, jobs.ErrNotFound)
	list, err := f.store.List(ctx, f.pool, jobs.ListParams{Tenant: "globex"})
	require.NoError(t, err)
	require.Empty(t, list.Jobs)
	require.Equal(t, before, f.rawJob(t, id), "another tenant changed nothing")

	got, err := f.store.Get(ctx, f.pool, "acme", id)
	require.NoError(t, err)
	require.Equal(t, id, got.ID)
	_, err = f.store.Get(ctx, f.pool, "acme", uuid.New())
	require.ErrorIs(t, err, jobs.ErrNotFound)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	ready, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	cancelled, err := f.store.Cancel(ctx, f.pool, "acme", ready.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateCancelled, cancelled.State)
	require.Equal(t, int64(2), cancelled.StateVersion)
	require.False(t, cancelled.FinishedAt.IsZero())
	again, err := f.store.Cancel(ctx, f.pool, "acme", ready.Job.ID)
	require.NoError(t, err, "cancelling twice is not an error")
	require.Equal(t, int64(2), again.StateVersion, "and changes nothing")
	events := f.events(t)
	require.Len(t, events, 2)
	require.Equal(t, "k.cancelled", events[1].eventType)

	// A running job only records the request; its runner honours it. The
	// lease is set here by hand because claiming belongs to the runner.
	running, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	f.setState(t, running.Job.ID, `state = 'RUNNING', lease_owner = 'w1', lease_until = now() + interval '1 minute'`)
	requested, err := f.store.Cancel(ctx, f.pool, "acme", running.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateRunning, requested.State)
	require.False(t, requested.CancelRequested.IsZero())
	require.True(t, requested.FinishedAt.IsZero())
	require.Len(t, f.events(t), 3, "only its requested event: none until the runner stops the job")

	done, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)
	f.setState(t, done.Job.ID, `state = 'SUCCEEDED', finished_at = now()`)
	before := f.rawJob(t, done.Job.ID)
	finished, err := f.store.Cancel(ctx, f.pool, "acme", done.Job.ID)
	require.ErrorIs(t, err, jobs.ErrAlreadyFinished)
	require.Equal(t, jobs.StateSucceeded, finished.State)
	require.Equal(t, before, f.rawJob(t, done.Job.ID))
}

func (f *fixture) setState(t *testing.T, id uuid.UUID, set string) {
	t.Helper()
	_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".jobs SET "+set+" WHERE id = $1", id)
	require.NoError(t, err)
}

func TestEnqueueRejectsBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)

	valid := func() jobs.EnqueueParams {
		return jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract", Payload: json.RawMessage(`{"id":1}`)}
	}
	tests := []struct {
		name   string
		mutate func(p *jobs.EnqueueParams)
		field  string
		cause  error
	}{
		{"empty tenant", func(p *jobs.EnqueueParams) { p.Tenant = "" }, "Tenant", nil},
		{"tenant with control character", func(p *jobs.EnqueueParams) { p.Tenant = "acme\n" }, "Tenant", nil},
		{"oversize tenant", func(p *jobs.EnqueueParams) { p.Tenant = strings.Repeat("t", jobs.MaxTenantLen+1) }, "Tenant", nil},
		{"empty kind", func(p *jobs.EnqueueParams) { p.Kind = "" }, "Kind", nil},
		{"kind with spaces", func(p *jobs.EnqueueParams) { p.Kind = "invoice extract" }, "Kind", nil},
		{"unknown queue", func(p *jobs.EnqueueParams) { p.Queue = "nope" }, "Queue", jobs.ErrUnknownQueue},
		{"negative priority", func(p *jobs.EnqueueParams) { p.Priority = -1 }, "Priority", nil},
		{"priority too high", func(p *jobs.EnqueueParams) { p.Priority = jobs.MaxPriority + 1 }, "Priority", nil},
		{"non-JSON payload", func(p *jobs.EnqueueParams) { p.Payload = json.RawMessage(`{"id":`) }, "Payload", nil},
		{"payload jsonb cannot store", func(p *jobs.EnqueueParams) { p.Payload = json.RawMessage(`{"a":"\u0000"}`) }, "Payload", nil},
		{"oversize payload", func(p *jobs.EnqueueParams) {
			p.Payload = json.RawMessage(`"` + strings.Repeat("x", jobs.DefaultMaxPayloadBytes) + `"`)
		}, "Payload", jobs.ErrPayloadTooLarge},
		{"oversize idempotency key", func(p *jobs.EnqueueParams) {
			p.IdempotencyKey = strings.Repeat("k", jobs.MaxIdempotencyKeyLen+1)
		}, "IdempotencyKey", nil},
		{"oversize request hash", func(p *jobs.EnqueueParams) {
			p.RequestHash = strings.Repeat("h", jobs.MaxRequestHashLen+1)
		}, "RequestHash", nil},
		{"oversize group key", func(p *jobs.EnqueueParams) { p.GroupKey = strings.Repeat("g", jobs.MaxGroupKeyLen+1) }, "GroupKey", nil},
		{"max attempts below one", func(p *jobs.EnqueueParams) { p.MaxAttempts = -1 }, "MaxAttempts", nil},
		{"max attempts too high", func(p *jobs.EnqueueParams) { p.MaxAttempts = jobs.MaxMaxAttempts + 1 }, "MaxAttempts", nil},
		{"deadline in the past", func(p *jobs.EnqueueParams) { p.DeadlineAt = time.Now().Add(-time.Second) }, "DeadlineAt", nil},
		{"deadline before availability", func(p *jobs.EnqueueParams) {
			p.AvailableAt = time.Now().Add(time.Hour)
			p.DeadlineAt = time.Now().Add(time.Minute)
		}, "DeadlineAt", nil},
		{"negative token estimate", func(p *jobs.EnqueueParams) { p.EstimatedTokens = -5 }, "EstimatedTokens", nil},
	}
	for _, tt := range tests {
		p := valid()
		tt.mutate(&p)
		_, err := f.store.Enqueue(t.Context(), f.pool, p)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, tt.name)
		var verr *llmqtype.ValidationError
		require.ErrorAs(t, err, &verr, tt.name)
		require.Equal(t, tt.field, verr.Field, tt.name)
		require.Contains(t, err.Error(), tt.field, "%s: the message names the field", tt.name)
		if tt.cause != nil {
			require.ErrorIs(t, err, tt.cause, tt.name)
		}

		// In a batch the field is named with its index, and nothing of the
		// batch is written.
		_, err = f.store.EnqueueMany(t.Context(), f.pool, []jobs.EnqueueParams{valid(), p})
		require.ErrorAs(t, err, &verr, tt.name)
		require.Equal(t, "params[1]."+tt.field, verr.Field, tt.name)
	}
	require.Zero(t, f.count(t, "jobs"), "no rejected input wrote a job")
	require.Zero(t, f.eventCount(t), "or an event")

	_, err := f.store.EnqueueMany(t.Context(), f.pool, nil)
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
}

func TestNewStoreRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []jobs.Config{
		{Schema: "public"},
		{Schema: "Bad-Name"},
		{Queues: []string{"has space"}},
		{Queues: []string{""}},
		{MaxPayloadBytes: -1},
		{DefaultMaxAttempts: -1},
		{ClaimIdleTimeout: -time.Second},
	} {
		_, err := jobs.NewStore(cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	var want []uuid.UUID
	for i := range 7 {
		kind := "a"
		if i%2 == 1 {
			kind = "b"
		}
		res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: kind})
		require.NoError(t, err)
		want = append([]uuid.UUID{res.Job.ID}, want...) // newest first
	}
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "globex", Kind: "a"})
	require.NoError(t, err)
	_, err = f.store.Cancel(ctx, f.pool, "acme", want[0])
	require.NoError(t, err)

	var got []uuid.UUID
	params := jobs.ListParams{Tenant: "acme", Limit: 3}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3)
		page, err := f.store.List(ctx, f.pool, params)
		require.NoError(t, err)
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		if page.NextCursor == "" {
			break
		}
		params.Cursor = page.NextCursor
	}
	require.Equal(t, want, got, "all of the tenant's jobs, newest first, across pages")

	byKind, err := f.store.List(ctx, f.pool, jobs.ListParams{Tenant: "acme", Kind: "b"})
	require.NoError(t, err)
	require.Len(t, byKind.Jobs, 3)
	byState, err := f.store.List(ctx, f.pool, jobs.ListParams{Tenant: "acme", States: []jobs.State{jobs.StateCancelled}})
	require.NoError(t, err)
	require.Len(t, byState.Jobs, 1)
	require.Equal(t, want[0], byState.Jobs[0].ID)

	for _, bad := range []jobs.ListParams{
		{},
		{Tenant: "acme", Limit: jobs.MaxListLimit + 1},
		{Tenant: "acme", States: []jobs.State{"DONE"}},
		{Tenant: "acme", Cursor: "not-a-cursor"},
	} {
		_, err := f.store.List(ctx, f.pool, bad)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, "%+v", bad)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	for range 3 {
		_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
		require.NoError(t, err)
	}
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: "webhooks",
		AvailableAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET available_at = now() - interval '90 seconds' WHERE queue = 'default'")
	require.NoError(t, err)

	stats, err := f.store.Stats(ctx, f.pool)
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, "default", stats[0].Queue)
	require.Equal(t, map[jobs.State]int64{jobs.StateReady: 3}, stats[0].Counts)
	require.InDelta(t, 90, stats[0].OldestEligibleAge.Seconds(), 30)
	require.Equal(t, "webhooks", stats[1].Queue)
	require.Zero(t, stats[1].OldestEligibleAge, "a job scheduled for later is not waiting")
}

// Enqueue wakes listeners on commit, not before, with the queue as payload.
func TestEnqueueNotifiesOnCommit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()

	conn, err := pgx.Connect(ctx, dbtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+f.store.Channel())
	require.NoError(t, err)

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = f.store.Enqueue(ctx, tx, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: "webhooks"})
	require.NoError(t, err)

	early, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = conn.WaitForNotification(early)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "nothing is delivered before commit")

	require.NoError(t, tx.Commit(ctx))
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wait)
	require.NoError(t, err)
	require.Equal(t, f.store.Channel(), n.Channel)
	require.Equal(t, "webhooks", n.Payload)
}

func TestRequestHashIsCanonical(t *testing.T) {
	t.Parallel()
	a, err := jobs.RequestHash(json.RawMessage(`{"b": [1, {"y": 2, "x": 1}], "a": "s"}`))
	require.NoError(t, err)
	b, err := jobs.RequestHash(map[string]any{"a": "s", "b": []any{1, map[string]any{"x": 1, "y": 2}}})
	require.NoError(t, err)
	require.Equal(t, a, b, "key order and white space do not matter")
	require.True(t, strings.HasPrefix(a, "sha256:"))

	c, err := jobs.RequestHash(json.RawMessage(`{"a": "s", "b": [{"y": 2, "x": 1}, 1]}`))
	require.NoError(t, err)
	require.NotEqual(t, a, c, "array order does")

	_, err = jobs.RequestHash(func() {})
	require.Error(t, err)
}

func TestDisableNotify(t *testing.T) {
	t.Parallel()
	f := setup(t)
	quiet, err := jobs.NewStore(jobs.Config{Schema: f.schema, DisableNotify: true})
	require.NoError(t, err)

	conn, err := pgx.Connect(t.Context(), dbtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(t.Context(), "LISTEN "+f.store.Channel())
	require.NoError(t, err)

	_, err = quiet.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: "default"})
	require.NoError(t, err)
	// A notifying enqueue afterwards: the first notification to arrive must
	// be its, so the quiet one sent none (notifications arrive in commit order).
	_, err = f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: "webhooks"})
	require.NoError(t, err)
	wait, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wait)
	require.NoError(t, err)
	require.Equal(t, "webhooks", n.Payload)
	require.Equal(t, 2, f.count(t, "jobs"))
}

func TestNotifyInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     []string
	}{
		// The first "default" enqueue notifies, the next two are within the
		// interval, then "webhooks".
		{"an hour", time.Hour, []string{"default", "webhooks"}},
		{"negative: every enqueue", -1, []string{"default", "default", "default", "webhooks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			limited, err := jobs.NewStore(jobs.Config{Schema: f.schema, Queues: []string{"default", "webhooks"}, NotifyInterval: tc.interval})
			require.NoError(t, err)

			conn, err := pgx.Connect(t.Context(), dbtest.URL())
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			_, err = conn.Exec(t.Context(), "LISTEN "+limited.Channel())
			require.NoError(t, err)

			for _, queue := range []string{"default", "default", "default", "webhooks"} {
				_, err = limited.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Queue: queue})
				require.NoError(t, err)
			}
			// Notifications arrive in commit order, so once "webhooks"
			// arrived, every earlier one has too.
			var got []string
			for len(got) == 0 || got[len(got)-1] != "webhooks" {
				wait, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				n, err := conn.WaitForNotification(wait)
				cancel()
				require.NoError(t, err, "notifications so far: %v", got)
				got = append(got, n.Payload)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, 4, f.count(t, "jobs"))
		})
	}
}
