package outbox_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/outbox"
)

// The claim reads as many events as it claims, whatever the backlog: the
// waiting events in write order through outbox_pending_idx, and each
// keyed event's "earlier unpublished event of its key?" through
// outbox_pending_key_idx in order, never a scan of the table. Generic plans, which
// a prepared statement ends up with, are what is checked.
func TestClaimReadsThroughItsIndexes(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	// Enough rows, and keys, that the planner's choice reflects a real
	// outbox; on a few hundred rows a sequential scan is legitimately
	// cheapest.
	tx, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	for i := range 5000 {
		_, err = f.store.Write(ctx, tx, outbox.Event{Topic: "orders", Key: fmt.Sprintf("order-%d", i%2000), Type: "order.changed", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox SET published_at = now() WHERE seq % 2 = 0")
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "ANALYZE "+f.db.Schema+".outbox")
	require.NoError(t, err)

	for _, skipLocked := range []bool{false, true} {
		plan := dbtest.GenericPlan(t, f.db.Pool, outbox.ClaimSQL(f.store, skipLocked), "500", "'relay'", "1000", "0", "9223372036854775807", "0")
		for _, index := range []string{"outbox_pending_idx", "outbox_pkey"} {
			require.Contains(t, plan, index, "skipping locked rows: %v\n%s", skipLocked, plan)
		}
		// An index scan in (hash, seq) order stops at the key's first
		// earlier event; a bitmap scan would collect all of them first.
		require.Regexp(t, `Index (Only )?Scan using outbox_pending_key_idx`, plan, "skipping locked rows: %v", skipLocked)
		require.NotRegexp(t, `Seq Scan on outbox\b`, plan, "skipping locked rows: %v", skipLocked)
	}
}

// The claim of a batch row reads the first entry of
// outbox_batches_pending_idx, however many batch rows are kept published,
// and probes each keyed event's key through outbox_pending_key_idx.
func TestClaimBatchReadsThroughItsIndexes(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	tx, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	for i := range 2000 {
		_, err = f.store.Write(ctx, tx, outbox.Event{Topic: "orders", Key: fmt.Sprintf("order-%d", i%500), Type: "order.changed", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	for i := range 500 {
		_, err = f.store.WriteBatch(ctx, tx, orderEvents(i*4, 4, func(n int) string { return fmt.Sprintf("order-%d", n%500) }))
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET published_at = now() WHERE first_seq % 10 <> 0")
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "ANALYZE "+f.db.Schema+".outbox, "+f.db.Schema+".outbox_batches")
	require.NoError(t, err)

	plan := dbtest.GenericPlan(t, f.db.Pool, outbox.ClaimBatchSQL(f.store), "'relay'", "1000", "0", "500")
	require.Contains(t, plan, "outbox_batches_pending_idx", plan)
	require.Regexp(t, `Index (Only )?Scan using outbox_pending_key_idx`, plan)
	require.NotRegexp(t, `Seq Scan on outbox(_batches)?\b`, plan)
}

// A relay releasing its own claims after a lost connection reads the
// unpublished rows of both tables through their pending indexes when they
// are few beside the published ones kept for Retention, not the tables.
func TestReleaseOwnClaimsReadsThroughItsIndexes(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	ctx := t.Context()
	tx, err := f.db.Pool.Begin(ctx)
	require.NoError(t, err)
	for i := range 5000 {
		_, err = f.store.Write(ctx, tx, outbox.Event{Topic: "orders", Key: fmt.Sprintf("order-%d", i%2000), Type: "order.changed", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	for i := range 1000 {
		_, err = f.store.WriteBatch(ctx, tx, orderEvents(i*4, 4, func(n int) string { return fmt.Sprintf("order-%d", n%500) }))
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox SET published_at = now() WHERE seq % 100 <> 0")
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "UPDATE "+f.db.Schema+".outbox_batches SET published_at = now() WHERE first_seq % 100 <> 0")
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, "ANALYZE "+f.db.Schema+".outbox, "+f.db.Schema+".outbox_batches")
	require.NoError(t, err)

	plan := dbtest.GenericPlan(t, f.db.Pool, outbox.ReleaseOwnClaimsSQL(f.store), "'relay'")
	require.Contains(t, plan, "outbox_pending_idx", plan)
	require.Contains(t, plan, "outbox_batches_pending_idx", plan)
	require.NotRegexp(t, `Seq Scan on outbox(_batches)?\b`, plan)
}
