package jobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtest"
)

type docArgs struct {
	Doc string `json:"doc"`
}

var summarise = jobs.NewKind[docArgs, string]("doc.summarise")

// Accept refuses an idempotency key without a request hash before writing
// anything, saying what to hash.
func TestAcceptRequiresARequestHashWithAKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	called := false
	_, err := summarise.Accept(ctx, store, db.Pool, "acme", jobs.EnqueueOptions{IdempotencyKey: "k"},
		func(context.Context, pgx.Tx) (docArgs, error) { called = true; return docArgs{}, nil })
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
	require.ErrorContains(t, err, "jobs.RequestHash(the client's request)")
	require.False(t, called)
	llmqtest.RequireNotEnqueued(ctx, t, db.Pool, store, "acme", summarise)
}

// An error from the host's write rolls back the job too; one from the
// enqueue rolls back the host's write.
func TestAcceptIsOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	_, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Schema+".docs (name text)")
	require.NoError(t, err)
	write := func(ctx context.Context, tx pgx.Tx) (docArgs, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+db.Schema+".docs VALUES ('x')")
		return docArgs{Doc: "x"}, err
	}
	boom := errors.New("boom")
	_, err = summarise.Accept(ctx, store, db.Pool, "acme", jobs.EnqueueOptions{}, func(ctx context.Context, tx pgx.Tx) (docArgs, error) {
		args, _ := write(ctx, tx)
		return args, boom
	})
	require.ErrorIs(t, err, boom)
	_, err = summarise.Accept(ctx, store, db.Pool, "acme", jobs.EnqueueOptions{Queue: "no-such-queue"}, write)
	require.ErrorIs(t, err, jobs.ErrUnknownQueue)
	var docs int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema+".docs").Scan(&docs))
	require.Zero(t, docs)
	llmqtest.RequireNotEnqueued(ctx, t, db.Pool, store, "acme", summarise)
}

// A store on a schema that was never migrated says so, and how to fix it,
// instead of "relation does not exist".
func TestNotMigratedSaysTheFix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = summarise.Enqueue(ctx, store, db.Pool, "acme", docArgs{}, jobs.EnqueueOptions{})
	require.ErrorIs(t, err, jobs.ErrNotMigrated)
	require.ErrorContains(t, err, "llmq migrate up -schema "+db.Schema)
	var notMigrated *jobs.NotMigratedError
	require.ErrorAs(t, err, &notMigrated)
	require.Equal(t, db.Schema, notMigrated.Schema)
	_, err = store.List(ctx, db.Pool, jobs.ListParams{Tenant: "acme"})
	require.ErrorIs(t, err, jobs.ErrNotMigrated)
	_, err = store.Stats(ctx, db.Pool)
	require.ErrorIs(t, err, jobs.ErrNotMigrated)
	_, err = store.Lookup(ctx, db.Pool, uuid.New())
	require.ErrorIs(t, err, jobs.ErrNotMigrated)
	_, err = store.Claim(ctx, db.Pool, jobs.ClaimParams{Queue: jobs.DefaultQueue, Worker: "w", Limit: 1, LeaseDuration: time.Minute, Kinds: []string{summarise.Name()}})
	require.ErrorIs(t, err, jobs.ErrNotMigrated)
}

// Args refuses a payload that does not decode, and a job of another kind,
// as malformed payloads; Result reads what the handler returned.
func TestKindDecodes(t *testing.T) {
	t.Parallel()
	_, err := summarise.Args(&jobs.Job{Kind: "doc.summarise", Payload: []byte(`{"doc": 1}`)})
	var malformed *jobs.MalformedPayloadError
	require.ErrorAs(t, err, &malformed)
	_, err = summarise.Args(&jobs.Job{Kind: "doc.other", Payload: []byte(`{}`)})
	require.ErrorAs(t, err, &malformed)
	args, err := summarise.Args(&jobs.Job{Kind: "doc.summarise", Payload: []byte(`{"doc": "a", "added_later": true}`)})
	require.NoError(t, err)
	require.Equal(t, docArgs{Doc: "a"}, args)
	r, err := summarise.Result(&jobs.Job{Result: []byte(`"short"`)})
	require.NoError(t, err)
	require.Equal(t, "short", r)
}

// Await returns the job once it is terminal, and ctx's error before.
func TestAwait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	res, err := summarise.Enqueue(ctx, store, db.Pool, "acme", docArgs{}, jobs.EnqueueOptions{})
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	_, err = jobs.Await(short, store, db.Pool, "acme", res.Job.ID, time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = store.Cancel(ctx, db.Pool, "acme", res.Job.ID)
	require.NoError(t, err)
	job, err := jobs.Await(ctx, store, db.Pool, "acme", res.Job.ID, 0)
	require.NoError(t, err)
	require.Equal(t, jobs.StateCancelled, job.State)
}

// Concurrent retries of one request leave one service row and one job,
// whichever wins.
func TestAcceptRacesToOneRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t, llmqtest.Options{MaxConns: 10})
	store := db.Jobs(t)
	_, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Schema+".docs (id uuid PRIMARY KEY)")
	require.NoError(t, err)
	hash, err := jobs.RequestHash("the request")
	require.NoError(t, err)
	const callers = 8
	results := make(chan jobs.EnqueueResult, callers)
	errs := make(chan error, callers)
	for range callers {
		go func() {
			res, err := summarise.Accept(ctx, store, db.Pool, "acme", jobs.EnqueueOptions{IdempotencyKey: "k", RequestHash: hash},
				func(ctx context.Context, tx pgx.Tx) (docArgs, error) {
					id := uuid.New()
					_, err := tx.Exec(ctx, "INSERT INTO "+db.Schema+".docs VALUES ($1)", id)
					return docArgs{Doc: id.String()}, err
				})
			results <- res
			errs <- err
		}()
	}
	ids, created := map[uuid.UUID]bool{}, 0
	for range callers {
		require.NoError(t, <-errs)
		res := <-results
		ids[res.Job.ID] = true
		if !res.Existing {
			created++
		}
	}
	require.Len(t, ids, 1)
	require.Equal(t, 1, created)
	var docs int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema+".docs").Scan(&docs))
	require.Equal(t, 1, docs)
}

// In the caller's transaction, Existing undoes only what write did.
func TestAcceptInACallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	_, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Schema+".docs (name text)")
	require.NoError(t, err)
	hash, err := jobs.RequestHash("r")
	require.NoError(t, err)
	write := func(ctx context.Context, tx pgx.Tx) (docArgs, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+db.Schema+".docs VALUES ('from write')")
		return docArgs{}, err
	}
	opts := jobs.EnqueueOptions{IdempotencyKey: "k", RequestHash: hash}
	_, err = summarise.Accept(ctx, store, db.Pool, "acme", opts, write)
	require.NoError(t, err)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "INSERT INTO "+db.Schema+".docs VALUES ('the caller''s')")
	require.NoError(t, err)
	res, err := summarise.Accept(ctx, store, tx, "acme", opts, write)
	require.NoError(t, err)
	require.True(t, res.Existing)
	require.NoError(t, tx.Commit(ctx))
	rows, err := db.Pool.Query(ctx, "SELECT name FROM "+db.Schema+".docs ORDER BY name")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"from write", "the caller's"}, names)
}

// The raw API's trap: a key without a RequestHash and a payload holding a
// fresh id turns a retry into a conflict; the error says why and the fix.
func TestConflictWithADerivedHashSaysTheFix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	for i, want := range []string{"", "set RequestHash to jobs.RequestHash of the client's request"} {
		_, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "doc.summarise", IdempotencyKey: "k",
			Payload: []byte(`{"row":"` + uuid.NewString() + `"}`)})
		if i == 0 {
			require.NoError(t, err)
			continue
		}
		var conflict *jobs.ConflictError
		require.ErrorAs(t, err, &conflict)
		require.True(t, conflict.DerivedHash)
		require.ErrorContains(t, err, want)
	}
	_, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "doc.summarise", IdempotencyKey: "k", RequestHash: "other"})
	require.ErrorIs(t, err, jobs.ErrIdempotencyConflict)
	require.NotContains(t, err.Error(), "no RequestHash", "an explicit hash that differs is a real conflict")
}
