// Command quickstart walks through durable acceptance with llmq: it migrates
// the schema, accepts a job inside a transaction, retries the same request
// (same job back), reuses the key for a different request (a conflict, HTTP
// 409 in a server), and prints the job with its outbox event.
//
//	go run ./examples/quickstart [-database-url URL] [-schema NAME]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
)

func main() {
	databaseURL := flag.String("database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL")
	schema := flag.String("schema", "llmq_quickstart", "Postgres schema for the llmq tables")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := run(ctx, *databaseURL, *schema)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, databaseURL, schema string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// 1. Migrate. Safe to call from every replica at start-up.
	res, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema})
	if err != nil {
		return err
	}
	fmt.Printf("1. migrated schema %q (%d new migrations, latest version %d)\n", schema, len(res.Migrations), llmq.LatestVersion())

	store, err := jobs.NewStore(jobs.Config{Schema: schema})
	if err != nil {
		return err
	}
	events, err := outbox.NewStore(outbox.Config{Schema: schema})
	if err != nil {
		return err
	}

	// 2. Accept a job in the caller's transaction. The request hash covers
	// what changes the result: document digest and version, schema, model.
	request := map[string]any{
		"document_sha256":  "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
		"document_version": 1,
		"schema":           "invoice-v2",
		"model_policy":     "extract-small",
	}
	payload, err := json.Marshal(request)
	if err != nil {
		return err
	}
	hash, err := jobs.RequestHash(request)
	if err != nil {
		return err
	}
	params := jobs.EnqueueParams{
		Tenant:         "acme",
		Kind:           "invoice.extract",
		Payload:        payload,
		IdempotencyKey: fmt.Sprintf("upload-%d", time.Now().UnixNano()),
		RequestHash:    hash,
	}
	var first jobs.EnqueueResult
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The host's own business write would go here, on tx.
		first, err = store.Enqueue(ctx, tx, params)
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("2. accepted job %s: state %s, existing=%v  (HTTP 202)\n", first.Job.ID, first.Job.State, first.Existing)

	// 3. The client retries the same request with the same key.
	retry, err := store.Enqueue(ctx, pool, params)
	if err != nil {
		return err
	}
	fmt.Printf("3. retried request -> job %s, existing=%v, same job: %v  (HTTP 200)\n", retry.Job.ID, retry.Existing, retry.Job.ID == first.Job.ID)

	// 4. The same key reused for a different document.
	params.RequestHash, err = jobs.RequestHash(map[string]any{"document_sha256": "fcde2b2e…", "document_version": 1})
	if err != nil {
		return err
	}
	_, err = store.Enqueue(ctx, pool, params)
	if !errors.Is(err, jobs.ErrIdempotencyConflict) {
		return fmt.Errorf("expected an idempotency conflict, got %w", err)
	}
	fmt.Printf("4. same key, different request -> %v  (HTTP 409)\n", err)

	// 5. The job and the event that was committed with it.
	job, err := store.Get(ctx, pool, "acme", first.Job.ID)
	if err != nil {
		return err
	}
	recs, err := events.ListByAggregate(ctx, pool, job.ID)
	if err != nil {
		return err
	}
	fmt.Println("5. the job and its outbox events:")
	return printJSON(map[string]any{"job": job, "outbox": recs})
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
