package openai_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	llmqopenai "github.com/llmq/llmq/provider/openai"
	"github.com/llmq/llmq/providerbatch"
)

// Each shape of an output or error file's line reads as its result: an
// answer, a refused request, a failed one, one the batch did not run
// (expired, cancelled), and lines that cannot be read.
func TestParseResultLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, line string
		want       providerbatch.Result
	}{
		{"answer", `{"id":"batch_req_1","custom_id":"a","response":{"status_code":200,"request_id":"r","body":{"id":"c","choices":[]}},"error":null}`,
			providerbatch.Result{CustomID: "a", Body: json.RawMessage(`{"id":"c","choices":[]}`)}},
		{"refused", `{"id":"batch_req_2","custom_id":"b","response":{"status_code":400,"body":{"error":{"message":"bad messages","type":"invalid_request_error","code":null}}},"error":null}`,
			providerbatch.Result{CustomID: "b", Err: &providerbatch.RequestError{Kind: providerbatch.RequestRefused, Status: 400, Code: "invalid_request_error", Message: "bad messages"}}},
		{"failed", `{"custom_id":"c","response":{"status_code":500,"body":{"error":{"message":"oops","type":"server_error","code":"internal"}}}}`,
			providerbatch.Result{CustomID: "c", Err: &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Status: 500, Code: "internal", Message: "oops"}}},
		{"rate limited", `{"custom_id":"d","response":{"status_code":429,"body":"not json"}}`,
			providerbatch.Result{CustomID: "d", Err: &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Status: 429, Message: `"not json"`}}},
		{"expired", `{"custom_id":"e","response":null,"error":{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}`,
			providerbatch.Result{CustomID: "e", Err: &providerbatch.RequestError{Kind: providerbatch.RequestExpired, Code: "batch_expired", Message: "This request could not be executed before the completion window expired."}}},
		{"cancelled", `{"custom_id":"f","response":null,"error":{"code":"batch_cancelled","message":"cancelled"}}`,
			providerbatch.Result{CustomID: "f", Err: &providerbatch.RequestError{Kind: providerbatch.RequestCancelled, Code: "batch_cancelled", Message: "cancelled"}}},
	} {
		require.Equal(t, tc.want, llmqopenai.ParseResultLine([]byte(tc.line)), tc.name)
	}
	for _, line := range []string{`not json`, `{"response":{"status_code":200,"body":{}}}`, `{"custom_id":"g"}`, `[]`} {
		got := llmqopenai.ParseResultLine([]byte(line))
		require.NotEmpty(t, got.Problem, "line %s", line)
		require.Nil(t, got.Err, "line %s", line)
	}
}

// No line, however malformed, panics or comes back as neither a result
// nor a problem.
func FuzzParseResultLine(f *testing.F) {
	for _, seed := range []string{
		`{"custom_id":"a","response":{"status_code":200,"body":{}}}`,
		`{"custom_id":"e","response":null,"error":{"code":"batch_expired","message":"m"}}`,
		`{"custom_id":"b","response":{"status_code":400,"body":{"error":{"code":5}}}}`,
		`{"custom_id":"","error":null}`, `null`, `{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r := llmqopenai.ParseResultLine(line)
		outcomes := 0
		if r.Problem != "" {
			outcomes++
		}
		if r.Err != nil {
			outcomes++
		}
		if r.Body != nil && r.Err == nil && r.Problem == "" {
			outcomes++
		}
		require.Equal(t, 1, outcomes, "line %q read as %+v", line, r)
	})
}

// The codec reads what the SDK reads, and refuses an answer without
// choices.
func TestChatCodec(t *testing.T) {
	t.Parallel()
	var c llmqopenai.Chat
	resp, err := c.Decode(json.RawMessage(`{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`))
	require.NoError(t, err)
	require.Equal(t, "hi", resp.Choices[0].Message.Content)
	require.Equal(t, int64(7), c.Usage(resp).InputTokens)
	require.Equal(t, int64(3), c.Usage(resp).OutputTokens)
	_, err = c.Decode(json.RawMessage(`{"id":"x","choices":[]}`))
	require.ErrorContains(t, err, "no choices")
	_, err = c.Decode(json.RawMessage(`[1]`))
	require.Error(t, err)
}

// A batch's results file reaches the submitter as it comes, even through
// a client built with Options: the first result is applied before the
// provider has sent the rest, so a file of hundreds of megabytes is never
// held in memory whole.
func TestResultsStreamThroughOptions(t *testing.T) {
	t.Parallel()
	firstApplied := make(chan struct{})
	var sentRestAfterFirst atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/batches/batch_1":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"batch_1","object":"batch","status":"completed","output_file_id":"file_out"}`)
		case "/v1/files/file_out/content":
			w.Header().Set("Content-Type", "application/octet-stream")
			line := `{"id":"r","custom_id":"%s","response":{"status_code":200,"body":{"id":"c","object":"chat.completion","choices":[]}}}` + "\n"
			_, _ = fmt.Fprintf(w, line, "job-1")
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			select {
			case <-firstApplied:
				sentRestAfterFirst.Store(true)
			case <-time.After(5 * time.Second):
			}
			_, _ = fmt.Fprintf(w, line, "job-2")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	batches, err := llmqopenai.NewBatches(client(t, srv.URL+"/v1", llmqopenai.Config{}), llmqopenai.BatchesConfig{})
	require.NoError(t, err)
	var ids []string
	err = batches.Results(t.Context(), "batch_1", func(r providerbatch.Result) error {
		ids = append(ids, r.CustomID)
		if len(ids) == 1 {
			close(firstApplied)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"job-1", "job-2"}, ids)
	require.True(t, sentRestAfterFirst.Load(), "the first result was read before the file was whole")
}
