package jobs_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// Invoice is the argument of the examples' kind: it names the service's own
// row, written in the same transaction as the job.
type Invoice struct{ InvoiceID uuid.UUID }

var extractInvoice = jobs.NewKind[Invoice, string]("invoice.extract")

// Accepting a job together with the service's own row, idempotently. The
// client sends its request twice under one idempotency key: the first call
// commits the service's row and the job; the retry finds the key taken by
// the same request, so Accept rolls the retry's row back and returns the
// first job with Existing set. The same key with another request is a
// conflict (409), and its row is rolled back too.
//
// The request hash is the client's request, not the payload: the payload
// holds the id generated in the transaction, which differs on every retry,
// so Accept refuses an idempotency key without a RequestHash.
func ExampleKind_Accept() {
	ctx := context.Background()
	const schema = "llmq_example_accept"
	pool, store, cleanup := ownRowsSchema(ctx, schema)
	defer cleanup()

	accept := func(key, doc string) (jobs.EnqueueResult, error) {
		hash, err := jobs.RequestHash(map[string]string{"document": doc}) // what changes the result
		if err != nil {
			return jobs.EnqueueResult{}, err
		}
		opts := jobs.EnqueueOptions{IdempotencyKey: key, RequestHash: hash}
		return extractInvoice.Accept(ctx, store, pool, "acme", opts, func(ctx context.Context, tx pgx.Tx) (Invoice, error) {
			id := uuid.New() // the service's own row, in Accept's transaction
			_, err := tx.Exec(ctx, "INSERT INTO "+schema+".invoices (id, doc) VALUES ($1, $2)", id, doc)
			return Invoice{InvoiceID: id}, err
		})
	}

	first, err := accept("upload-1", "s3://invoices/42.pdf")
	if err != nil {
		panic(err)
	}
	fmt.Println("first request: existing", first.Existing)

	retry, err := accept("upload-1", "s3://invoices/42.pdf")
	if err != nil {
		panic(err)
	}
	fmt.Println("retried request: existing", retry.Existing, "same job", retry.Job.ID == first.Job.ID)

	_, err = accept("upload-1", "s3://invoices/43.pdf")
	fmt.Println("same key, other request: conflict", errors.Is(err, jobs.ErrIdempotencyConflict))

	args, err := extractInvoice.Args(retry.Job)
	if err != nil {
		panic(err)
	}
	fmt.Println("invoice rows:", countInvoices(ctx, pool, schema), "the job names the first row:", hasInvoice(ctx, pool, schema, args.InvoiceID))

	_, err = extractInvoice.Accept(ctx, store, pool, "acme", jobs.EnqueueOptions{IdempotencyKey: "upload-2"},
		func(context.Context, pgx.Tx) (Invoice, error) { return Invoice{InvoiceID: uuid.New()}, nil })
	var invalid *llmqtype.ValidationError
	fmt.Println("a key without a request hash is refused:", errors.As(err, &invalid) && invalid.Field == "RequestHash")
	// Output:
	// first request: existing false
	// retried request: existing true same job true
	// same key, other request: conflict true
	// invoice rows: 1 the job names the first row: true
	// a key without a request hash is refused: true
}

// The same recipe on the raw API, in the service's own transaction: write
// the row, enqueue on the same transaction, and on Existing roll the
// transaction back (the row written for the retry must not stay) and answer
// with the job accepted the first time. The trap it avoids is shown last:
// without a RequestHash the hash is derived from the payload, which names
// the row's fresh id, so a retry is a conflict instead of the first job.
func ExamplePostgresStore_Enqueue_ownRow() {
	ctx := context.Background()
	const schema = "llmq_example_own_row"
	pool, store, cleanup := ownRowsSchema(ctx, schema)
	defer cleanup()

	accept := func(key, doc string, hashTheRequest bool) (*jobs.Job, bool, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, false, err
		}
		defer func() { _ = tx.Rollback(ctx) }() // undoes the row unless committed
		id := uuid.New()
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".invoices (id, doc) VALUES ($1, $2)", id, doc); err != nil {
			return nil, false, err
		}
		params, err := extractInvoice.Params("acme", Invoice{InvoiceID: id}, jobs.EnqueueOptions{IdempotencyKey: key})
		if err != nil {
			return nil, false, err
		}
		if hashTheRequest {
			if params.RequestHash, err = jobs.RequestHash(map[string]string{"document": doc}); err != nil {
				return nil, false, err
			}
		}
		res, err := store.Enqueue(ctx, tx, params)
		if err != nil {
			return nil, false, err
		}
		if res.Existing {
			return res.Job, true, tx.Rollback(ctx) // a retry: keep no second row
		}
		return res.Job, false, tx.Commit(ctx)
	}

	first, _, err := accept("upload-1", "s3://invoices/42.pdf", true)
	if err != nil {
		panic(err)
	}
	again, existing, err := accept("upload-1", "s3://invoices/42.pdf", true)
	if err != nil {
		panic(err)
	}
	fmt.Println("retry: existing", existing, "same job", again.ID == first.ID, "invoice rows:", countInvoices(ctx, pool, schema))

	if _, _, err := accept("upload-2", "s3://invoices/43.pdf", false); err != nil {
		panic(err)
	}
	_, _, err = accept("upload-2", "s3://invoices/43.pdf", false)
	fmt.Println("without a request hash, the retry is a conflict:", errors.Is(err, jobs.ErrIdempotencyConflict))
	// Output:
	// retry: existing true same job true invoice rows: 1
	// without a request hash, the retry is a conflict: true
}

// ownRowsSchema migrates schema and adds the service's own table to it.
func ownRowsSchema(ctx context.Context, schema string) (*pgxpool.Pool, *jobs.PostgresStore, func()) {
	pool, cleanup := dbtest.ForExample(ctx, schema)
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".invoices (id uuid PRIMARY KEY, doc text NOT NULL)"); err != nil {
		panic(err)
	}
	return pool, store, cleanup
}

func countInvoices(ctx context.Context, pool *pgxpool.Pool, schema string) int {
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".invoices").Scan(&n); err != nil {
		panic(err)
	}
	return n
}

func hasInvoice(ctx context.Context, pool *pgxpool.Pool, schema string, id uuid.UUID) bool {
	var found bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+schema+".invoices WHERE id = $1)", id).Scan(&found); err != nil {
		panic(err)
	}
	return found
}
