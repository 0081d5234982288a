// Command typed (DATABASE_URL, else libpq defaults): migrate, accept idempotently, retry, print.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

type Extract struct{ InvoiceID uuid.UUID }

var Extraction = jobs.NewKind[Extract, string]("invoice.extract") // enqueues and handles: no second spelling

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), "llmq_typed", os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "typed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, schema string, out io.Writer) (err error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+schema+".invoices (id uuid PRIMARY KEY, doc text)"); err != nil {
		return fmt.Errorf("create the service's own table: %w", err)
	}
	doc := "s3://invoices/42.pdf" // the client's request, sent twice under one idempotency key
	hash, err := jobs.RequestHash(doc)
	if err != nil {
		return fmt.Errorf("hash request: %w", err)
	}
	opts := jobs.EnqueueOptions{IdempotencyKey: fmt.Sprint("upload-", time.Now().UnixNano()), RequestHash: hash}
	var accepted [2]jobs.EnqueueResult
	for i := range accepted {
		accepted[i], err = Extraction.Accept(ctx, store, pool, "acme", opts, func(ctx context.Context, tx pgx.Tx) (Extract, error) {
			id := uuid.New() // on a retried request, this row is rolled back and the first job returned
			_, err := tx.Exec(ctx, "INSERT INTO "+schema+".invoices VALUES ($1, $2)", id, doc)
			return Extract{InvoiceID: id}, err
		})
		if err != nil {
			return fmt.Errorf("accept request %d: %w", i+1, err)
		}
	}
	runner, err := lease.NewRunner(pool, store, lease.Config{Handlers: lease.Kinds(lease.Handle(Extraction,
		func(ctx context.Context, job *jobs.Job, args Extract) (string, error) {
			if job.Attempt == 1 {
				return "", errors.New("provider: 503") // a plain error is retried with backoff
			}
			return "total 1234.50", nil
		}))})
	if err != nil {
		return fmt.Errorf("new runner: %w", err)
	}
	stop := runner.Start(ctx)
	defer func() { err = errors.Join(err, stop()) }() // stop the runner on every return, reporting its error too
	job, err := jobs.Await(ctx, store, pool, "acme", accepted[0].Job.ID, 0)
	if err != nil {
		return fmt.Errorf("await job: %w", err)
	}
	total, err := Extraction.Result(job)
	if err != nil {
		return fmt.Errorf("read result: %w", err)
	}
	attempts, err := store.Attempts(ctx, pool, "acme", job.ID)
	if err != nil {
		return fmt.Errorf("list attempts: %w", err)
	}
	fmt.Fprintf(out, "retry existing=%v, %s %q\n", accepted[1].Existing && accepted[1].Job.ID == job.ID, job.State, total)
	for _, a := range attempts {
		fmt.Fprintf(out, "attempt %d: %s %s\n", a.Attempt, a.Outcome, a.Error)
	}
	return nil
}
