package outbox_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// Every call that reads or writes the outbox answers ErrNotMigrated, naming
// the schema, on a schema that was never migrated.
func TestEveryCallSaysNotMigrated(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	ctx := t.Context()
	requireNotMigrated := func(t *testing.T, err error, call string) {
		t.Helper()
		require.ErrorIs(t, err, llmqtype.ErrNotMigrated, call)
		var nm *llmqtype.NotMigratedError
		require.ErrorAs(t, err, &nm, call)
		require.Equal(t, db.Schema, nm.Schema, call)
	}

	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = store.ListByAggregate(ctx, db.Pool, uuid.Must(uuid.NewV7()))
	requireNotMigrated(t, err, "ListByAggregate")
	two := []outbox.Event{{Topic: "t", Type: "x", Payload: []byte(`{}`)}, {Topic: "t", Type: "y", Payload: []byte(`{}`)}}
	_, err = store.WriteBatch(ctx, db.Pool, two)
	requireNotMigrated(t, err, "WriteBatch")

	relay, err := store.NewRelay(db.Pool, memory.New(memory.Config{}).Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	_, err = relay.RelayOnce(ctx)
	requireNotMigrated(t, err, "RelayOnce")
	_, err = relay.Drain(ctx)
	requireNotMigrated(t, err, "Drain")
	_, err = relay.Stats(ctx)
	requireNotMigrated(t, err, "Stats")
	_, err = relay.Prune(ctx)
	requireNotMigrated(t, err, "Prune")

	pruner, err := outbox.NewPruner(db.Schema)
	require.NoError(t, err)
	_, err = pruner.PrunePublished(ctx, db.Pool, time.Hour, 10)
	requireNotMigrated(t, err, "PrunePublished")
	_, err = pruner.PruneUnrelayed(ctx, db.Pool, time.Hour, 10)
	requireNotMigrated(t, err, "PruneUnrelayed")
	_, err = pruner.CountPublished(ctx, db.Pool, time.Hour)
	requireNotMigrated(t, err, "CountPublished")
	_, err = pruner.CountUnrelayed(ctx, db.Pool, time.Hour)
	requireNotMigrated(t, err, "CountUnrelayed")
	_, _, _, err = pruner.Backlog(ctx, db.Pool, 10)
	requireNotMigrated(t, err, "Backlog")
	_, _, err = pruner.Oldest(ctx, db.Pool)
	requireNotMigrated(t, err, "Oldest")
	_, err = pruner.RelayLease(ctx, db.Pool)
	requireNotMigrated(t, err, "RelayLease")
}
