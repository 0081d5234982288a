package invoice

import (
	"github.com/llmq/llmq/jobs"
)

// RouteVersion names the extraction's model route: the primary model
// (Payload.Model, Model) and what may stand in for it (WorkerConfig.Fallback,
// in Anthropic's dialect). It is in every extraction's reuse key instead of
// the model that served: change it when the models a route may serve from
// change, so that a result of the old route is never taken for the new
// one.
const RouteVersion = "invoice-route/v1"

// extractionReuse is the result reuse of an extraction of p on queue
// (jobs.Reuse): a job whose key already has a computed success of the
// tenant's within a day takes that result instead of calling the provider,
// and one whose key is being extracted waits for it. The key holds what
// decides the answer and the policy's verdict on it:
//
//   - the model route: Payload.Model, the model the job was accepted for,
//     which a routed worker asks first (PrimaryCandidate), and
//     RouteVersion, which names the route's candidates. Never the model
//     that served: with WorkerConfig.Fallback a job's answer may come from
//     the primary or the fallback, and either is the route's answer
//     (lease: "a reuse key should not name the model when a route may
//     serve the job from another"), checked by the same policy, so it is
//     reused whichever served;
//   - the prompt (PromptVersion), the schema and the validation policy;
//   - the SHA-256 of the document's bytes, which PutDocument computed and
//     acceptance checked against the stored version; not the document's
//     name or version, nor the Idempotency-Key: the same bytes uploaded
//     again under another name are the same invoice, paid for once;
//   - the lane (the queue): a job waits while another of its key runs, and
//     a job in the batch lane runs for up to a day in the provider's
//     batch, so a document needed sooner must not wait behind it. Each
//     lane reuses its own results; the same bytes in both lanes are paid
//     for once in each.
//
// The output budget (Config.MaxTokens) is left out: an answer it cut short
// is malformed, never a success to reuse. The key is the tenant's own
// (not Shared): its documents are private, and each result was checked
// against the tenant's supplier master data, whose changes invalidate the
// tenant's results (PutSupplier).
func extractionReuse(p Payload, queue string) (*jobs.Reuse, error) {
	key, err := jobs.ReuseKey(map[string]string{
		"model": p.Model, "route": RouteVersion, "prompt": PromptVersion, "schema": p.Schema, "policy": p.Policy,
		"sha256": p.Document.SHA256, "lane": queue,
	})
	if err != nil {
		return nil, err
	}
	return &jobs.Reuse{Key: key}, nil
}
