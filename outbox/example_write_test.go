package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/outbox"
)

// Write an event in the transaction that makes the change it describes: it
// exists if and only if that change commits.
func ExampleStore_Write() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_outbox") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_outbox"}); err != nil {
		panic(err)
	}
	store, err := outbox.NewStore(outbox.Config{Schema: "llmq_example_outbox"})
	if err != nil {
		panic(err)
	}

	orderID := uuid.New()
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	// ... UPDATE orders SET status = 'placed' WHERE id = orderID, on tx ...
	_, err = store.Write(ctx, tx, outbox.Event{
		AggregateID: orderID,
		Topic:       "orders",
		Key:         orderID.String(), // events of one order publish in order
		Type:        "order.placed",
		Payload:     json.RawMessage(`{"order_id":"` + orderID.String() + `"}`),
	})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	events, err := store.ListByAggregate(ctx, pool, orderID)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(events), events[0].Type, "published:", !events[0].PublishedAt.IsZero())
	// Output: 1 order.placed published: false
}
