package outbox_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

func setup(t *testing.T) (*outbox.Store, *pgxpool.Pool, string) {
	t.Helper()
	db := dbtest.Setup(t)
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	return store, db.Pool, db.Schema
}

func count(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+schema+".outbox").Scan(&n))
	return n
}

func TestWriteCommitsWithTheTransaction(t *testing.T) {
	t.Parallel()
	store, pool, schema := setup(t)
	ctx := t.Context()
	order := uuid.New()

	ev := outbox.Event{
		AggregateID: order,
		Topic:       "orders",
		Key:         order.String(),
		Type:        "order.placed",
		Payload:     json.RawMessage(`{"order_id":"` + order.String() + `"}`),
		Headers:     map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = store.Write(ctx, tx, ev)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, count(t, pool, schema), "a rolled-back transaction leaves no event")

	var first, second outbox.Record
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if first, err = store.Write(ctx, tx, ev); err != nil {
			return err
		}
		second, err = store.Write(ctx, tx, ev)
		return err
	})
	require.NoError(t, err)
	require.NotEqual(t, uuid.Nil, first.ID, "an ID is assigned")
	require.Equal(t, uuid.Version(7), first.ID.Version())
	require.NotEqual(t, first.ID, second.ID)
	require.Less(t, first.Seq, second.Seq, "write order is recorded")

	recs, err := store.ListByAggregate(ctx, pool, order)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	got := recs[0]
	require.Equal(t, first.ID, got.ID)
	require.Equal(t, ev.Topic, got.Topic)
	require.Equal(t, ev.Key, got.Key)
	require.Equal(t, ev.Type, got.Type)
	require.JSONEq(t, string(ev.Payload), string(got.Payload))
	require.Equal(t, ev.Headers, got.Headers)
	require.True(t, got.PublishedAt.IsZero(), "nothing is published by Write")
	require.Zero(t, got.Attempts)
}

func TestWriteKeepsTheGivenID(t *testing.T) {
	t.Parallel()
	store, pool, _ := setup(t)
	id := uuid.New()
	rec, err := store.Write(t.Context(), pool, outbox.Event{ID: id, Topic: "t", Type: "x", Payload: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.Equal(t, id, rec.ID)

	_, err = store.Write(t.Context(), pool, outbox.Event{ID: id, Topic: "t", Type: "x", Payload: json.RawMessage(`1`)})
	require.Error(t, err, "an event ID is unique")
}

func TestWriteRejectsBadEvents(t *testing.T) {
	t.Parallel()
	store, pool, schema := setup(t)

	valid := func() outbox.Event {
		return outbox.Event{Topic: "orders", Type: "order.placed", Payload: json.RawMessage(`{}`)}
	}
	tests := []struct {
		name   string
		mutate func(*outbox.Event)
		field  string
	}{
		{"no topic", func(e *outbox.Event) { e.Topic = "" }, "Topic"},
		{"oversize topic", func(e *outbox.Event) { e.Topic = strings.Repeat("t", outbox.MaxTopicLen+1) }, "Topic"},
		{"no type", func(e *outbox.Event) { e.Type = "" }, "Type"},
		{"control character in key", func(e *outbox.Event) { e.Key = "a\x00b" }, "Key"},
		{"no payload", func(e *outbox.Event) { e.Payload = nil }, "Payload"},
		{"non-JSON payload", func(e *outbox.Event) { e.Payload = json.RawMessage(`{`) }, "Payload"},
		{"oversize payload", func(e *outbox.Event) {
			e.Payload = json.RawMessage(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes) + `"`)
		}, "Payload"},
		{"too many headers", func(e *outbox.Event) {
			e.Headers = map[string]string{}
			for i := range outbox.MaxHeaders + 1 {
				e.Headers[strings.Repeat("h", i+1)] = "v"
			}
		}, "Headers"},
		{"empty header name", func(e *outbox.Event) { e.Headers = map[string]string{"": "v"} }, "Headers"},
	}
	for _, tt := range tests {
		ev := valid()
		tt.mutate(&ev)
		_, err := store.Write(t.Context(), pool, ev)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, tt.name)
		var verr *llmqtype.ValidationError
		require.ErrorAs(t, err, &verr, tt.name)
		require.Equal(t, tt.field, verr.Field, tt.name)
	}
	require.Zero(t, count(t, pool, schema), "nothing rejected was written")
}

func TestNewStoreRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewStore(outbox.Config{Schema: "public"})
	require.Error(t, err)
	_, err = outbox.NewStore(outbox.Config{MaxPayloadBytes: -1})
	require.Error(t, err)
}
