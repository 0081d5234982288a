package providerbatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	"github.com/llmq/llmq/providerbatch"
)

// The same extraction as a Messages API call: the kind every Anthropic
// test batches.
var claudeKind = jobs.NewKind[docArgs, fakeprovider.Extraction]("doc.extract.claude")

var claudeCall = providerbatch.NewCall(claudeKind, llmqanthropic.Messages{}, buildClaude, parseClaude)

func buildClaude(_ context.Context, _ *jobs.Job, a docArgs) (sdk.MessageNewParams, error) {
	return sdk.MessageNewParams{
		Model: "claude-test", MaxTokens: 800, System: []sdk.TextBlockParam{{Text: "extract"}},
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(a.Text))},
	}, nil
}

func parseClaude(_ context.Context, _ *jobs.Job, _ docArgs, m *sdk.Message) (fakeprovider.Extraction, error) {
	var ex fakeprovider.Extraction
	if len(m.Content) == 0 {
		return ex, jobs.InvalidOutput(errors.New("the answer has no content"), nil)
	}
	text := m.Content[0].Text
	if err := json.Unmarshal([]byte(text), &ex); err != nil {
		return ex, jobs.InvalidOutput(fmt.Errorf("the extraction is not JSON: %w", err), json.RawMessage(fmt.Sprintf("%q", text)))
	}
	return ex, nil
}

// anthropicConfig is h's submitter config for the pool "anthropic",
// served by Message Batches on h's fake.
func (h *harness) anthropicConfig() providerbatch.Config {
	opts, err := llmqanthropic.Options(llmqanthropic.Config{})
	require.NoError(h.t, err)
	client := sdk.NewClient(append([]option.RequestOption{option.WithBaseURL(h.url), option.WithAPIKey("key")}, opts...)...)
	cfg := h.cfg
	cfg.Pool, cfg.ID = "anthropic", "submitter-claude"
	cfg.Provider = llmqanthropic.NewBatches(client, llmqanthropic.BatchesConfig{})
	cfg.Calls = []providerbatch.KindCall{claudeCall.Batch()}
	return cfg
}

// enqueueClaude accepts one Anthropic batch job per text.
func (h *harness) enqueueClaude(texts ...string) []uuid.UUID {
	h.t.Helper()
	ids := make([]uuid.UUID, len(texts))
	for i, text := range texts {
		res, err := claudeKind.Enqueue(h.t.Context(), h.store, h.db.Pool, "acme", docArgs{Text: text},
			jobs.EnqueueOptions{Queue: batchQueue, DeadlineAt: time.Now().Add(48 * time.Hour), MaxAttempts: 3})
		require.NoError(h.t, err)
		ids[i] = res.Job.ID
	}
	return ids
}

// Message Batches serve the jobs as OpenAI's Batch API does: one batch,
// each result an attempt of the submitter under its job's fence, a
// refused request failing only its job, a malformed answer invalid output,
// and the synchronous path's result for the same answer.
func TestSubmitterServesJobsThroughMessageBatches(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	texts := make([]string, 20)
	for i := range texts {
		texts[i] = invoice(i, "")
	}
	texts = append(texts, invoice(20, "[[fake:batch-400]]"), invoice(21, "[[fake:malformed]]"))
	ids := h.enqueueClaude(texts...)
	cfg := h.anthropicConfig()
	cfg.Retry = llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond}
	s := h.submitter(cfg)
	h.passUntil(s, "all finished", func() bool {
		st := h.states()
		return st[jobs.StateSucceeded]+st[jobs.StateFailedTerminal]+st[jobs.StateReviewRequired] == len(ids)
	})

	require.Zero(t, h.fake.Stats().Calls, "no synchronous call")
	for _, id := range ids[:20] {
		j := h.job(id)
		require.Equal(t, jobs.StateSucceeded, j.State)
		a := h.attempts(id)
		require.Len(t, a, 1)
		require.Equal(t, "providerbatch:anthropic", a[0].Worker)
		require.Positive(t, a[0].Usage.InputTokens)
	}
	refused := h.job(ids[20])
	require.Equal(t, jobs.StateFailedTerminal, refused.State)
	require.Equal(t, jobs.ClassPermanent, refused.ErrorClass)
	require.Len(t, h.attempts(ids[20]), 1, "a refused request is not sent again")
	malformed := h.job(ids[21])
	require.Equal(t, jobs.StateReviewRequired, malformed.State)
	require.Equal(t, jobs.ClassInvalidOutput, malformed.ErrorClass)

	// The synchronous path, through the same Call, for the first document.
	opts, err := llmqanthropic.Options(llmqanthropic.Config{})
	require.NoError(t, err)
	client := sdk.NewClient(append([]option.RequestOption{option.WithBaseURL(h.url), option.WithAPIKey("key")}, opts...)...)
	handler := claudeCall.Handle(func(ctx context.Context, req sdk.MessageNewParams) (*sdk.Message, error) {
		return client.Messages.New(ctx, req)
	})
	first := h.job(ids[0])
	syncResult, err := handler.Handler.Work(t.Context(), first)
	require.NoError(t, err)
	require.JSONEq(t, string(syncResult), string(first.Result), "the batch path's result is the synchronous path's")

	subs := h.submissions()
	require.NotEmpty(t, subs)
	require.Equal(t, "anthropic", subs[len(subs)-1].Provider)
	require.Equal(t, "claude-test", subs[len(subs)-1].Model)
	require.Equal(t, "ended", subs[len(subs)-1].ProviderStatus, "Message Batches end as \"ended\"")
}

// Message Batches carry no metadata, so a submission whose create was
// lost is found by its shape: the one batch of its size created since it
// was recorded that no submission knows. It is adopted, not sent again.
func TestSubmitterAdoptsALostMessageBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueueClaude(invoice(1, ""), invoice(2, ""))
	cfg := h.anthropicConfig()
	cfg.Provider = &loseCreate{Provider: cfg.Provider, lose: 1}
	s := h.submitter(cfg)
	require.NoError(t, s.Pass(t.Context()))
	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated)
	require.Equal(t, "preparing", h.submissions()[0].State)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated, "adopted, not sent again")
	for _, id := range ids {
		require.Len(t, h.attempts(id), 1, "applied once")
	}
}

// When several batches of a lost submission's size were created since it
// was recorded (another client of the workspace), which is its own cannot
// be told: it is sent again, and only the batch it records is read, so
// each job is applied once.
func TestSubmitterSendsAnAmbiguousMessageBatchAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueueClaude(invoice(1, ""), invoice(2, ""))
	cfg := h.anthropicConfig()
	cfg.Provider = &loseCreate{Provider: cfg.Provider, lose: 1}
	s := h.submitter(cfg)
	require.NoError(t, s.Pass(t.Context()))
	require.Equal(t, "preparing", h.submissions()[0].State)
	// Someone else's batch of two requests, created meanwhile.
	foreign, err := h.anthropicConfig().Provider.Create(t.Context(), providerbatch.Batch{Model: "claude-test", Requests: []providerbatch.Request{
		{CustomID: "other-1", Body: json.RawMessage(`{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)},
		{CustomID: "other-2", Body: json.RawMessage(`{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)},
	}})
	require.NoError(t, err)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
	require.Equal(t, int64(3), h.fake.Stats().BatchesCreated, "the lost one, the foreign one, and the submission sent again")
	for _, id := range ids {
		require.Len(t, h.attempts(id), 1, "applied once")
	}
	subs := h.submissions()
	require.Len(t, subs, 1)
	require.NotEqual(t, foreign, subs[0].ProviderBatchID)
}

// Anthropic's per-batch request limit splits a gather, as OpenAI's does.
func TestSubmitterSplitsMessageBatchesWithinTheLimits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{AnthropicBatchMaxRequests: 4})
	texts := make([]string, 10)
	for i := range texts {
		texts[i] = invoice(i, strings.Repeat("x", i))
	}
	h.enqueueClaude(texts...)
	cfg := h.anthropicConfig()
	cfg.Limits.MaxRequests = 4
	h.passUntil(h.submitter(cfg), "all succeeded", h.allIn(jobs.StateSucceeded, len(texts)))
	st := h.fake.Stats()
	require.Equal(t, int64(3), st.BatchesCreated, "10 requests, 4 a batch")
	require.Zero(t, st.BatchesRefused)
}
