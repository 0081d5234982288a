package admission_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// One acquire takes a request, a token reservation and an in-flight slot
// from a pool shared by every process; release reconciles the reservation
// with what the provider reported.
func ExamplePostgres() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_admission")
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_admission"}); err != nil {
		panic(err)
	}
	limiter, err := admission.NewPostgres(pool, admission.Config{Schema: "llmq_example_admission"})
	if err != nil {
		panic(err)
	}
	// Limits are data: every process sees them, and they can change at run
	// time. (A token a second, so that the figures below hold still.)
	if err := limiter.SetPool(ctx, admission.Pool{Name: "openai-gpt", RPM: 600, TPM: 60, TokenBurst: 10_000, MaxInFlight: 1}); err != nil {
		panic(err)
	}

	permit, err := limiter.Acquire(ctx, admission.Request{Pool: "openai-gpt", Tenant: "acme", Tokens: 4000})
	if err != nil {
		panic(err)
	}
	_, err = limiter.Acquire(ctx, admission.Request{Pool: "openai-gpt", Tenant: "acme", Tokens: 4000})
	var wait *admission.WaitError
	if errors.As(err, &wait) {
		fmt.Println("second call waits:", wait.Reason)
	}
	_, err = limiter.Acquire(ctx, admission.Request{Pool: "openai-gpt", Tokens: 50_000})
	fmt.Println("larger than the burst:", errors.Is(err, admission.ErrNeverAdmissible))

	// The provider answered and reported 1,200 tokens: 2,800 come back.
	if err := permit.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 1000, OutputTokens: 200}); err != nil {
		panic(err)
	}
	state, err := limiter.State(ctx, "openai-gpt")
	if err != nil {
		panic(err)
	}
	fmt.Println("in flight:", state.InFlight)
	fmt.Printf("tokens spent: %.0f\n", float64(state.TokenBurst)-state.TokenLevel)
	// Output:
	// second call waits: in_flight
	// larger than the burst: true
	// in flight: 0
	// tokens spent: 1200
}

// A provider's 429 with Retry-After cools the pool down for every holder.
func ExampleObserve() {
	ctx := context.Background()
	limiter, err := admission.NewLocal(admission.Pool{Name: "anthropic", RPM: 50, TPM: 40_000, MaxInFlight: 5})
	if err != nil {
		panic(err)
	}
	h := http.Header{}
	h.Set("Retry-After", "5")
	h.Set("Anthropic-Ratelimit-Tokens-Remaining", "0")
	signal, err := admission.Observe(ctx, limiter, "anthropic", http.StatusTooManyRequests, h)
	if err != nil {
		panic(err)
	}
	fmt.Println("cooldown:", signal.Cooldown)
	_, err = limiter.Acquire(ctx, admission.Request{Pool: "anthropic", Tokens: 100})
	if d, ok := admission.WaitDuration(err); ok {
		fmt.Println("acquire waits about:", d.Round(time.Second))
	}
	// Output:
	// cooldown: 5s
	// acquire waits about: 5s
}

// Tenant quotas refuse work at acceptance, inside the enqueue
// transaction, with the HTTP status and Retry-After a server should send.
func ExampleQuotas() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_quotas")
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_quotas"}); err != nil {
		panic(err)
	}
	quotas, err := admission.NewQuotas(admission.QuotaConfig{
		Schema:  "llmq_example_quotas",
		Default: admission.TenantQuota{MaxPendingJobs: 2},
	})
	if err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_quotas", OnAccept: quotas.Hook()})
	if err != nil {
		panic(err)
	}
	for i := range 3 {
		_, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract"})
		var refused *admission.QuotaError
		switch {
		case errors.As(err, &refused):
			fmt.Printf("job %d: HTTP %d, %s, Retry-After %v\n", i+1, refused.Status, refused.Dimension, refused.RetryAfter)
		case err != nil:
			panic(err)
		default:
			fmt.Printf("job %d: accepted\n", i+1)
		}
	}
	// Output:
	// job 1: accepted
	// job 2: accepted
	// job 3: HTTP 429, pending_jobs, Retry-After 30s
}
