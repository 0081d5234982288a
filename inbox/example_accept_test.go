package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
)

// Accept a message in the transaction that does its work; the redelivery of
// the same message is recognised and does nothing.
func ExampleStore_Accept() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_inbox") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_inbox"}); err != nil {
		panic(err)
	}
	store, err := inbox.NewStore(inbox.Config{Schema: "llmq_example_inbox"})
	if err != nil {
		panic(err)
	}

	msg := broker.Message{ID: "evt-7f3a", Topic: "llmq.jobs", Body: []byte(`{"job_id":"…","state":"SUCCEEDED"}`)}
	for delivery := 1; delivery <= 2; delivery++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := store.Accept(ctx, tx, "erp-sync", msg, broker.Source{Queue: "erp"})
			if err != nil {
				return err
			}
			fmt.Printf("delivery %d: %s\n", delivery, res)
			if res == inbox.Duplicate {
				return nil
			}
			// ... the message's work, on tx ...
			return nil
		})
		if err != nil {
			panic(err)
		}
		// Acknowledge the delivery only here, after the commit.
	}
	// Output:
	// delivery 1: new
	// delivery 2: duplicate
}
