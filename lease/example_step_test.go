package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// A two-step handler: OCR, then extraction. The first attempt's extraction
// fails; the retry takes the stored OCR text instead of paying for OCR
// again, and the job's steps say which attempt ran each one.
func ExampleStep() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_step") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_step"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_step"})
	if err != nil {
		panic(err)
	}

	var ocrCalls atomic.Int32
	process := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		text, err := lease.Step(ctx, "ocr", func(ctx context.Context) (string, error) {
			ocrCalls.Add(1) // the paid call
			lease.RecordUsage(ctx, jobs.Usage{InputTokens: 1200, OutputTokens: 300})
			return "INVOICE 42 TOTAL 1234.50 EUR", nil
		})
		if err != nil {
			return nil, err
		}
		return lease.Step(ctx, "extract", func(ctx context.Context) (json.RawMessage, error) {
			if job.Attempt == 1 {
				return nil, errors.New("provider: 503 Service Unavailable")
			}
			words := strings.Fields(text)
			return json.Marshal(map[string]string{"total": words[3], "currency": words[4]})
		})
	})
	runner, err := lease.NewRunner(pool, store, lease.Config{
		Handlers: map[string]lease.Handler{"invoice.process": process},
		Retry:    llmqtype.BackoffPolicy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	stop := runner.Start(ctx)

	res, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.process"})
	if err != nil {
		panic(err)
	}
	for {
		job, err := store.Get(ctx, pool, "acme", res.Job.ID)
		if err != nil {
			panic(err)
		}
		if job.State.Terminal() {
			fmt.Println(job.State, string(job.Result))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		panic(err)
	}

	fmt.Println("OCR calls:", ocrCalls.Load())
	steps, err := store.Steps(ctx, pool, "acme", res.Job.ID)
	if err != nil {
		panic(err)
	}
	for _, s := range steps {
		fmt.Printf("step %s: run by attempt %d, reused by %v, %d tokens in\n", s.Name, s.Attempt, s.ReusedBy, s.Usage.InputTokens)
	}
	// Output:
	// SUCCEEDED {"total": "1234.50", "currency": "EUR"}
	// OCR calls: 1
	// step ocr: run by attempt 1, reused by [2], 1200 tokens in
	// step extract: run by attempt 2, reused by [], 0 tokens in
}
