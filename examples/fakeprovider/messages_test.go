package fakeprovider_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
)

// postMessages sends one Messages API request with body and returns the
// answer's status, headers and body.
func postMessages(t *testing.T, url, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages", bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	req.Header.Set("x-api-key", "key-a")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, buf.Bytes()
}

// messagesBody is a Messages API request about doc.
func messagesBody(t *testing.T) string {
	t.Helper()
	user, err := json.Marshal([]fakeprovider.ContentBlock{{Type: "text", Text: doc}})
	require.NoError(t, err)
	b, err := json.Marshal(fakeprovider.MessagesRequest{
		Model: "m", MaxTokens: 100, System: json.RawMessage(`[{"type":"text","text":"extract"}]`),
		Messages: []fakeprovider.MessagesMessage{{Role: "user", Content: user}},
	})
	require.NoError(t, err)
	return string(b)
}

// The Messages API answers with the extraction in a text block, its usage,
// and Anthropic's rate-limit headers; past its RPM it answers 429 with
// retry-after, which admission reads as a cooldown; FailNext answers 500
// and a request without messages is 400, each with Anthropic's error body.
func TestMessagesAPI(t *testing.T) {
	t.Parallel()
	calls := make(chan fakeprovider.Call, 10)
	srv := fakeprovider.New(fakeprovider.Config{Scale: 15_000, RPM: 60, OnCall: func(c fakeprovider.Call) { calls <- c }})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)

	status, h, body := postMessages(t, hs.URL, messagesBody(t))
	require.Equal(t, http.StatusOK, status, "%s", body)
	var msg fakeprovider.MessagesResponse
	require.NoError(t, json.Unmarshal(body, &msg))
	require.Equal(t, "message", msg.Type)
	require.Len(t, msg.Content, 1)
	var ex fakeprovider.Extraction
	require.NoError(t, json.Unmarshal([]byte(msg.Content[0].Text), &ex))
	require.Equal(t, "DE89370400440532013000", ex.IBAN)
	require.Positive(t, msg.Usage.InputTokens)
	require.Positive(t, msg.Usage.OutputTokens)
	require.Equal(t, "60", h.Get("anthropic-ratelimit-requests-limit"))
	require.Equal(t, "0", h.Get("anthropic-ratelimit-requests-remaining"))
	_, err := time.Parse(time.RFC3339Nano, h.Get("anthropic-ratelimit-requests-reset"))
	require.NoError(t, err)
	call := <-calls
	require.Equal(t, "anthropic", call.API)
	require.Equal(t, "key-a", call.APIKey)
	require.Equal(t, doc, call.Document)
	require.Equal(t, msg.Usage.InputTokens, call.PromptTokens)
	require.Equal(t, msg.Usage.OutputTokens, call.CompletionTokens)

	status, h, body = postMessages(t, hs.URL, messagesBody(t))
	require.Equal(t, http.StatusTooManyRequests, status)
	secs, err := strconv.Atoi(h.Get("retry-after"))
	require.NoError(t, err)
	require.Positive(t, secs)
	require.JSONEq(t, `{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached; retry later"}}`, string(body))
	require.Positive(t, admission.ParseSignal(status, h, time.Now()).Cooldown)
	require.Equal(t, "rate-limited", (<-calls).Fault)

	srv2 := fakeprovider.New(fakeprovider.Config{Scale: 15_000})
	hs2 := httptest.NewServer(srv2)
	t.Cleanup(hs2.Close)
	srv2.FailNext(1)
	status, _, body = postMessages(t, hs2.URL, messagesBody(t))
	require.Equal(t, http.StatusInternalServerError, status)
	require.Contains(t, string(body), `"api_error"`)
	status, _, _ = postMessages(t, hs2.URL, messagesBody(t))
	require.Equal(t, http.StatusOK, status, "FailNext(1) fails one call")
	status, _, body = postMessages(t, hs2.URL, `{"model":"m","max_tokens":10}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(body), `"invalid_request_error"`)
	require.Equal(t, fakeprovider.Stats{Calls: 3, Answered: 1, ServerErrors: 1, BadRequests: 1}, srv2.Stats())
}
