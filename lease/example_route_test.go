package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// cannedModel is a host's own provider client, a candidate's Adapter; real
// routes use provider/openai's or provider/anthropic's *Client.
type cannedModel struct{ answer string }

func (cannedModel) Provider() string { return "canned" }

// A kind routed over two candidates. The primary's pool is cooling down (a
// provider 429 would have set it for every process), so the attempt is
// served by the secondary without a call to the primary; one handler
// serves both, asking lease.CandidateOf which to call.
func ExampleRoute() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_route")
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_route"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_route"})
	if err != nil {
		panic(err)
	}
	limiter, err := admission.NewLocal(
		admission.Pool{Name: "primary", RPM: 600, TPM: 1_000_000, MaxInFlight: 10},
		admission.Pool{Name: "secondary", RPM: 600, TPM: 1_000_000, MaxInFlight: 10})
	if err != nil {
		panic(err)
	}
	if err := limiter.Cooldown(ctx, "primary", time.Minute); err != nil {
		panic(err)
	}

	extract := lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		candidate, _ := lease.CandidateOf(ctx)
		model, ok := candidate.Adapter.(cannedModel) // a real handler switches on *llmqopenai.Client, *llmqanthropic.Client
		if !ok {
			return nil, jobs.Permanent(fmt.Errorf("no client for %s", candidate.Adapter.Provider()))
		}
		return json.RawMessage(fmt.Sprintf(`{"model":%q,"answer":%q}`, candidate.Model, model.answer)), nil
	})
	runner, err := lease.NewRunner(pool, store, lease.Config{
		Handlers: map[string]lease.Handler{"invoice.extract": extract},
		Admission: &lease.Admission{Limiter: limiter, Routes: map[string]lease.Route{"invoice.extract": {Candidates: []lease.Candidate{
			{Pool: "primary", Model: "large-model", Adapter: cannedModel{answer: "from the primary"}},
			{Pool: "secondary", Model: "other-model", Adapter: cannedModel{answer: "from the secondary"}},
		}}}},
	})
	if err != nil {
		panic(err)
	}
	stop := runner.Start(ctx)

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
			attempts, err := store.Attempts(ctx, pool, "acme", job.ID)
			if err != nil {
				panic(err)
			}
			fmt.Println(job.State, string(job.Result))
			fmt.Println("served by", attempts[0].Candidate, "with", attempts[0].Model)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		panic(err)
	}
	// Output:
	// SUCCEEDED {"model": "other-model", "answer": "from the secondary"}
	// served by secondary with other-model
}
