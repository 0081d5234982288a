package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// Enqueue in the caller's own transaction: the job, its requested event and
// the caller's business write commit together. A retried request with the
// same idempotency key returns the same job; the same key with another
// request is a conflict.
func ExamplePostgresStore_Enqueue() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_enqueue") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_enqueue"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_enqueue"})
	if err != nil {
		panic(err)
	}

	// The request hash covers what changes the result: the document's digest
	// and version, the schema, the model policy. Not a signed URL.
	request := map[string]any{"document_sha256": "9f86d0…", "document_version": 3, "schema": "invoice-v2"}
	hash, err := jobs.RequestHash(request)
	if err != nil {
		panic(err)
	}
	payload, err := json.Marshal(request)
	if err != nil {
		panic(err)
	}
	params := jobs.EnqueueParams{
		Tenant:         "acme",
		Kind:           "invoice.extract",
		Payload:        payload,
		IdempotencyKey: "upload-7f3a",
		RequestHash:    hash,
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	// ... the host's own writes on tx ...
	first, err := store.Enqueue(ctx, tx, params)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Println("accepted:", first.Job.State, "existing:", first.Existing)

	retry, err := store.Enqueue(ctx, pool, params)
	if err != nil {
		panic(err)
	}
	fmt.Println("retry is the same job:", retry.Job.ID == first.Job.ID, "existing:", retry.Existing)

	params.RequestHash = "sha256:another-request"
	_, err = store.Enqueue(ctx, pool, params)
	fmt.Println("same key, other request:", errors.Is(err, jobs.ErrIdempotencyConflict))

	_, err = store.Get(ctx, pool, "globex", first.Job.ID)
	fmt.Println("another tenant sees it:", !errors.Is(err, jobs.ErrNotFound))
	// Output:
	// accepted: READY existing: false
	// retry is the same job: true existing: true
	// same key, other request: true
	// another tenant sees it: false
}
