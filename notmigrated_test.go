package llmq_test

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/pgbouncertest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

// The first call a component makes on a schema that was never migrated
// answers llmqtype.ErrNotMigrated, naming the schema, the setting that
// chose it and the command that fixes it, not PostgreSQL's bare
// "relation does not exist": on a direct connection, and behind PgBouncer
// in each exec mode it works with, where pgx reports a statement's error
// with its rows rather than from Query.
func TestUnmigratedSchemaSaysTheFix(t *testing.T) {
	t.Parallel()
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		pool, opts := setup(t)
		requireFixes(t, pool, opts)
	})
	for _, mode := range poolerModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			_, opts := setup(t)
			requireFixes(t, pooledPool(t, pgbouncertest.Start(t).URL(mode)), opts)
		})
	}
}

func requireFixes(t *testing.T, pool *pgxpool.Pool, opts llmq.MigrateOptions) {
	t.Helper()
	requireFix := func(t *testing.T, err error, setting string) {
		t.Helper()
		require.ErrorIs(t, err, llmqtype.ErrNotMigrated)
		var nm *llmqtype.NotMigratedError
		require.ErrorAs(t, err, &nm)
		require.Equal(t, opts.Schema, nm.Schema)
		require.Contains(t, err.Error(), "llmq migrate up -schema "+opts.Schema)
		require.Contains(t, err.Error(), setting)
	}

	t.Run("jobs", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store, err := jobs.NewStore(jobs.Config{Schema: opts.Schema})
		require.NoError(t, err)
		_, err = store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "t", Kind: "k"})
		requireFix(t, err, "jobs.Config.Schema")
	})
	t.Run("admission", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		limiter, err := admission.NewPostgres(pool, admission.Config{Schema: opts.Schema})
		require.NoError(t, err)
		_, err = limiter.Acquire(ctx, admission.Request{Pool: "p", Tenant: "t", Tokens: 1})
		requireFix(t, err, "admission.Config.Schema")
	})
	t.Run("outbox", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store, err := outbox.NewStore(outbox.Config{Schema: opts.Schema})
		require.NoError(t, err)
		_, err = store.Write(ctx, pool, outbox.Event{ID: uuid.Must(uuid.NewV7()), Topic: "t", Type: "x", Payload: json.RawMessage(`{}`)})
		requireFix(t, err, "outbox.Config.Schema")
		relay, err := store.NewRelay(pool, memory.New(memory.Config{}).Publisher(), outbox.RelayConfig{})
		require.NoError(t, err)
		_, err = relay.Drain(ctx)
		requireFix(t, err, "outbox.Config.Schema")
	})
	t.Run("inbox", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		store, err := inbox.NewStore(inbox.Config{Schema: opts.Schema})
		require.NoError(t, err)
		_, err = store.Accept(ctx, pool, "c", broker.Message{ID: "m", Body: []byte(`{}`)}, broker.Source{})
		requireFix(t, err, "inbox.Config.Schema")
	})
	t.Run("webhook", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		js, err := jobs.NewStore(jobs.Config{Schema: opts.Schema, Queues: []string{"default", webhook.DefaultQueue}})
		require.NoError(t, err)
		ob, err := outbox.NewStore(outbox.Config{Schema: opts.Schema})
		require.NoError(t, err)
		store, err := webhook.NewStore(webhook.Config{Schema: opts.Schema, Jobs: js, Outbox: ob})
		require.NoError(t, err)
		_, err = store.Enqueue(ctx, pool, "t", webhook.Event{Type: "x.done", Payload: json.RawMessage(`{}`)})
		requireFix(t, err, "webhook.Config.Schema")
	})
}
