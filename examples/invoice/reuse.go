package invoice

import (
	"github.com/llmq/llmq/jobs"
)

// extractionReuse is the result reuse of an extraction of p on queue
// (jobs.Reuse): a job whose key already has a computed success of the
// tenant's within a day takes that result instead of calling the provider,
// and one whose key is being extracted waits for it. The key holds what
// decides the answer and the policy's verdict on it:
//
//   - the model, the prompt (PromptVersion), the schema and the
//     validation policy;
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
		"model": p.Model, "prompt": PromptVersion, "schema": p.Schema, "policy": p.Policy,
		"sha256": p.Document.SHA256, "lane": queue,
	})
	if err != nil {
		return nil, err
	}
	return &jobs.Reuse{Key: key}, nil
}
