package invoice

import (
	"encoding/json"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// message is an Anthropic Messages answer whose text is content, or its
// JSON when it is not a string.
func message(t *testing.T, content any) *sdk.Message {
	t.Helper()
	text, ok := content.(string)
	if !ok {
		c, err := json.Marshal(content)
		require.NoError(t, err)
		text = string(c)
	}
	body, err := json.Marshal(map[string]any{
		"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-fake", "stop_reason": "end_turn",
		"content": []map[string]string{{"type": "text", "text": text}},
		"usage":   map[string]int{"input_tokens": 100, "output_tokens": 50},
	})
	require.NoError(t, err)
	var m sdk.Message
	require.NoError(t, json.Unmarshal(body, &m))
	return &m
}

// The fallback's dialect asks with the same system prompt and document,
// and its answers get the primary's checks: a result, review findings, or
// invalid output, alike.
func TestFallbackDialectChecksAsThePrimary(t *testing.T) {
	t.Parallel()
	f := setupWorker(t)
	ctx := t.Context()
	var p Payload
	require.NoError(t, json.Unmarshal(f.job.Payload, &p))

	req, err := f.svc.buildMessages(ctx, f.job, p)
	require.NoError(t, err)
	require.Equal(t, sdk.Model(Model), req.Model, "without a route candidate, the payload's model")
	require.Len(t, req.System, 1)
	require.Equal(t, systemPrompt, req.System[0].Text)
	body, err := json.Marshal(req)
	require.NoError(t, err)
	var sent struct {
		Messages []struct {
			Role    string `json:"role"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(body, &sent))
	require.Len(t, sent.Messages, 1)
	require.Equal(t, "user", sent.Messages[0].Role)
	require.Equal(t, ocr, sent.Messages[0].Content[0].Text, "the document as the user's message, as data")
	require.Equal(t, int64(f.svc.cfg.MaxTokens), req.MaxTokens)

	result, err := f.svc.parseMessages(ctx, f.job, p, message(t, goodExtraction()))
	require.NoError(t, err)
	require.Equal(t, PolicyVersion, result.Policy)
	require.Empty(t, result.Findings)

	wrong := goodExtraction()
	wrong.Total = "99.99"
	_, err = f.svc.parseMessages(ctx, f.job, p, message(t, wrong))
	var review *jobs.ReviewError
	require.ErrorAs(t, err, &review, "the same policy sends it to review")
	require.Contains(t, string(review.Result), `"rule":"arithmetic"`)

	var invalid *jobs.InvalidOutputError
	_, err = f.svc.parseMessages(ctx, f.job, p, message(t, `{"supplier_name": `))
	require.ErrorAs(t, err, &invalid)
	require.JSONEq(t, `"{\"supplier_name\": "`, string(invalid.Output), "the malformed output is kept for a reviewer")
	_, err = f.svc.parseMessages(ctx, f.job, p, &sdk.Message{})
	require.ErrorAs(t, err, &invalid, "an answer without text")
}

// A fallback that would share the primary's pool, or lacks its model, is
// refused when the runner is built.
func TestFallbackConfigRefused(t *testing.T) {
	t.Parallel()
	f := setupWorker(t)
	for name, fb := range map[string]Fallback{
		"same pool": {ProviderURL: "http://127.0.0.1:1", Pool: "provider", Model: "claude-fake"},
		"no model":  {ProviderURL: "http://127.0.0.1:1", Pool: "fallback"},
		"no url":    {Pool: "fallback", Model: "claude-fake"},
	} {
		_, err := f.svc.NewRunner(t.Context(), WorkerConfig{ProviderURL: "http://127.0.0.1:1/v1", Fallback: &fb})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "Fallback", name)
	}
}
