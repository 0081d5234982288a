package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// A runner with one handler. The handler's errors say how an attempt ended:
// here a 429 asks for a retry no sooner than the provider's Retry-After, and
// the second attempt succeeds.
func ExampleRunner() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_runner") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_runner"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_runner"})
	if err != nil {
		panic(err)
	}

	extract := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		if job.Attempt == 1 {
			// What a handler does with a provider's 429 and its Retry-After.
			return nil, jobs.RetryAfterHeader(errors.New("provider: 429 Too Many Requests"), "1")
		}
		lease.RecordUsage(ctx, jobs.Usage{InputTokens: 1800, OutputTokens: 240})
		return json.RawMessage(`{"invoice_total":"1234.50","currency":"EUR"}`), nil
	})
	runner, err := lease.NewRunner(pool, store, lease.Config{
		Handlers: map[string]lease.Handler{"invoice.extract": extract},
		Retry:    llmqtype.BackoffPolicy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()

	res, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract"})
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
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	attempts, err := store.Attempts(ctx, pool, "acme", res.Job.ID)
	if err != nil {
		panic(err)
	}
	for _, a := range attempts {
		fmt.Printf("attempt %d: %s %s retry_after_1s=%v tokens=%d\n", a.Attempt, a.Outcome, a.ErrorClass,
			!a.RetryAt.IsZero() && a.RetryAt.Sub(a.EndedAt) >= time.Second-time.Millisecond, a.Usage.InputTokens)
	}
	// Output:
	// SUCCEEDED {"currency": "EUR", "invoice_total": "1234.50"}
	// attempt 1: retry_scheduled transient retry_after_1s=true tokens=0
	// attempt 2: succeeded  retry_after_1s=false tokens=1800
}
