package anthropic_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/fakeprovider"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	"github.com/llmq/llmq/provider/internal/providertest"
	"github.com/llmq/llmq/providerbatch"
)

// batchFake is a fake provider with its batches held, Batches on it
// through a client built with Options, and how many HTTP requests reached
// the fake.
func batchFake(t *testing.T) (*fakeprovider.Server, *llmqanthropic.Batches, *atomic.Int64) {
	t.Helper()
	fake := fakeprovider.New(fakeprovider.Config{Scale: 15_000})
	fake.HoldBatches()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return fake, llmqanthropic.NewBatches(client(t, srv.URL, llmqanthropic.Config{}), llmqanthropic.BatchesConfig{}), &requests
}

// stubBatches is Batches on a server that answers with handler.
func stubBatches(t *testing.T, handler http.Handler) *llmqanthropic.Batches {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return llmqanthropic.NewBatches(client(t, srv.URL, llmqanthropic.Config{}), llmqanthropic.BatchesConfig{})
}

// messageParams is a Messages API request about text.
func messageParams(text string) sdk.MessageNewParams {
	return sdk.MessageNewParams{
		Model: "claude-test", MaxTokens: 800, System: []sdk.TextBlockParam{{Text: "extract"}},
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(text))},
	}
}

// batchRequest is one request of a batch about text, encoded by the codec.
func batchRequest(t *testing.T, id, text string) providerbatch.Request {
	t.Helper()
	body, err := llmqanthropic.Messages{}.Encode(messageParams(text))
	require.NoError(t, err)
	return providerbatch.Request{CustomID: id, Body: body}
}

func create(t *testing.T, b *llmqanthropic.Batches, requests ...providerbatch.Request) string {
	t.Helper()
	id, err := b.Create(t.Context(), providerbatch.Batch{Model: "claude-test", Requests: requests})
	require.NoError(t, err)
	require.NotEmpty(t, id)
	return id
}

// waitEnded polls the batch until it ended.
func waitEnded(t *testing.T, b *llmqanthropic.Batches, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := b.Status(t.Context(), id)
		require.NoError(t, err)
		require.False(t, s.Failed)
		return s.Ended
	}, 10*time.Second, 10*time.Millisecond)
}

// results reads a batch's results by custom id.
func results(t *testing.T, b *llmqanthropic.Batches, id string) map[string]providerbatch.Result {
	t.Helper()
	out := map[string]providerbatch.Result{}
	require.NoError(t, b.Results(t.Context(), id, func(r providerbatch.Result) error {
		require.Empty(t, r.Problem, "result %+v", r)
		out[r.CustomID] = r
		return nil
	}))
	return out
}

// A batch runs until Anthropic ends it, then its results read as the
// synchronous path would decide them: an answer, a request refused (400,
// terminal), one failed (500, retried), and an answer whose model output
// is not what was asked for, which is the kind's parser's to refuse.
func TestBatchesAnswers(t *testing.T) {
	t.Parallel()
	fake, b, _ := batchFake(t)
	id := create(t, b,
		batchRequest(t, "ok", providertest.Document),
		batchRequest(t, "refused", providertest.Document+"[[fake:batch-400]]"),
		batchRequest(t, "failed", providertest.Document+"[[fake:batch-500]]"),
		batchRequest(t, "malformed", providertest.Document+"[[fake:malformed]]"))

	s, err := b.Status(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, providerbatch.Status{State: "in_progress"}, s)
	err = b.Results(t.Context(), id, func(providerbatch.Result) error { return nil })
	var apiErr *sdk.Error
	require.ErrorAs(t, err, &apiErr, "no results before the batch ends")
	require.Equal(t, http.StatusBadRequest, apiErr.StatusCode)
	require.ErrorContains(t, err, id)

	fake.ReleaseBatches()
	waitEnded(t, b, id)
	s, err = b.Status(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, providerbatch.Status{State: "ended", Ended: true}, s)

	res := results(t, b, id)
	require.Len(t, res, 4)
	var codec llmqanthropic.Messages
	msg, err := codec.Decode(res["ok"].Body)
	require.NoError(t, err)
	require.Nil(t, res["ok"].Err)
	var ex fakeprovider.Extraction
	require.NoError(t, json.Unmarshal([]byte(msg.Content[0].Text), &ex))
	require.Equal(t, "DE89370400440532013000", ex.IBAN)
	require.Positive(t, codec.Usage(msg).InputTokens)
	require.Positive(t, codec.Usage(msg).OutputTokens)

	require.Equal(t, &providerbatch.RequestError{Kind: providerbatch.RequestRefused, Status: http.StatusBadRequest,
		Code: "invalid_request_error", Message: "the request was refused ([[fake:batch-400]])"}, res["refused"].Err)
	require.Nil(t, res["refused"].Body)
	require.Equal(t, providerbatch.RequestFailed, res["failed"].Err.Kind)
	require.Equal(t, http.StatusInternalServerError, res["failed"].Err.Status)
	require.Equal(t, "api_error", res["failed"].Err.Code)

	msg, err = codec.Decode(res["malformed"].Body)
	require.NoError(t, err, "a message whose text is not JSON is still a message")
	require.Error(t, json.Unmarshal([]byte(msg.Content[0].Text), &ex))
}

// A batch that expires ends with none of its requests run; each comes back
// expired, to wait for a later batch without counting an attempt.
func TestBatchesExpired(t *testing.T) {
	t.Parallel()
	fake, b, _ := batchFake(t)
	id := create(t, b, batchRequest(t, "a", providertest.Document), batchRequest(t, "b", providertest.Document))
	require.Equal(t, 1, fake.ExpireBatches())
	waitEnded(t, b, id)
	res := results(t, b, id)
	require.Len(t, res, 2)
	for _, r := range res {
		require.Nil(t, r.Body)
		require.Equal(t, providerbatch.RequestExpired, r.Err.Kind)
	}
}

// A cancelled batch ends with its requests cancelled; it cannot be
// cancelled again once ended.
func TestBatchesCancelled(t *testing.T) {
	t.Parallel()
	_, b, _ := batchFake(t)
	id := create(t, b, batchRequest(t, "a", providertest.Document))
	require.NoError(t, b.Cancel(t.Context(), id))
	waitEnded(t, b, id)
	res := results(t, b, id)
	require.Len(t, res, 1)
	require.Equal(t, providerbatch.RequestCancelled, res["a"].Err.Kind)
	err := b.Cancel(t.Context(), id)
	require.ErrorContains(t, err, id)
	var apiErr *sdk.Error
	require.ErrorAs(t, err, &apiErr)
}

// A body that is not a Messages API request is refused before anything
// is sent, naming its request; one the provider refuses keeps the SDK's
// error. Find never finds: Message Batches carry no tag.
func TestBatchesCreateRefusals(t *testing.T) {
	t.Parallel()
	_, b, requests := batchFake(t)
	for name, body := range map[string]string{
		"array": `[1]`, "string": `"x"`, "null": `null`, "not JSON": `{`, "no model": `{"max_tokens":1,"messages":[]}`,
		"no max_tokens": `{"model":"m","messages":[]}`, "no messages": `{"model":"m","max_tokens":1}`, "model not a string": `{"model":5,"max_tokens":1,"messages":[]}`,
	} {
		_, err := b.Create(t.Context(), providerbatch.Batch{Requests: []providerbatch.Request{
			batchRequest(t, "good", providertest.Document), {CustomID: "bad", Body: json.RawMessage(body)},
		}})
		require.ErrorContains(t, err, "request bad", name)
	}
	require.Zero(t, requests.Load(), "nothing was sent")

	_, err := b.Create(t.Context(), providerbatch.Batch{Requests: []providerbatch.Request{
		batchRequest(t, "twice", providertest.Document), batchRequest(t, "twice", providertest.Document),
	}})
	var apiErr *sdk.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusBadRequest, apiErr.StatusCode)

	// A lost batch is found by its shape: the one of its size since the
	// submission that no submission recorded.
	since := time.Now().Add(-time.Minute)
	one := create(t, b, batchRequest(t, "a", providertest.Document))
	two := create(t, b, batchRequest(t, "b", providertest.Document), batchRequest(t, "c", providertest.Document))
	found, err := b.Find(t.Context(), providerbatch.Lost{Requests: 2, Since: since})
	require.NoError(t, err)
	require.Equal(t, []string{two}, found)
	found, err = b.Find(t.Context(), providerbatch.Lost{Requests: 2, Since: since, Known: map[string]bool{two: true}})
	require.NoError(t, err)
	require.Empty(t, found, "a batch a submission recorded is not a lost one")
	found, err = b.Find(t.Context(), providerbatch.Lost{Requests: 2, Since: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	require.Empty(t, found, "none created since")
	other := create(t, b, batchRequest(t, "d", providertest.Document))
	found, err = b.Find(t.Context(), providerbatch.Lost{Requests: 1, Since: since})
	require.ErrorIs(t, err, providerbatch.ErrCannotFind, "two of its shape: which is it?")
	require.Empty(t, found)
	found, err = b.Find(t.Context(), providerbatch.Lost{Requests: 1, Since: since, Known: map[string]bool{other: true}})
	require.NoError(t, err)
	require.Equal(t, []string{one}, found)
	require.Equal(t, "anthropic", b.Name())
	require.Equal(t, providerbatch.Limits{MaxRequests: 100_000, MaxBytes: 256 << 20}, b.Limits())
}

// Each processing status maps to whether the batch ended: a batch being
// cancelled has not, nor has one in a status llmq does not know.
func TestBatchesStatus(t *testing.T) {
	t.Parallel()
	// The stub answers with the status the batch's id names.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/messages/batches/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msgbatch_1","type":"message_batch","processing_status":"`+r.PathValue("id")+`","request_counts":{}}`)
	})
	b := stubBatches(t, mux)
	for status, ended := range map[string]bool{"in_progress": false, "canceling": false, "ended": true, "archiving": false} {
		s, err := b.Status(t.Context(), status)
		require.NoError(t, err)
		require.Equal(t, providerbatch.Status{State: status, Ended: ended}, s)
	}
}

// A results line that cannot be read is passed on with Problem set, and
// the lines after it are read; fn's error stops the read.
func TestBatchesResultsReadPastBadLines(t *testing.T) {
	t.Parallel()
	lines := strings.Join([]string{
		`{"custom_id":"a","result":{"type":"succeeded","message":{"type":"message"}}}`,
		`not json`,
		``,
		`{"custom_id":"b","result":{"type":"pending"}}`,
		`{"custom_id":"c","result":{"type":"expired"}}`,
	}, "\n")
	var path, accept atomic.Value
	b := stubBatches(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.Path)
		accept.Store(r.Header.Get("Accept"))
		w.Header().Set("Content-Type", "application/x-jsonl")
		_, _ = io.WriteString(w, lines)
	}))
	var got []providerbatch.Result
	require.NoError(t, b.Results(t.Context(), "msgbatch_1", func(r providerbatch.Result) error {
		got = append(got, r)
		return nil
	}))
	require.Equal(t, "/v1/messages/batches/msgbatch_1/results", path.Load())
	require.Equal(t, "application/x-jsonl", accept.Load())
	require.Len(t, got, 4)
	require.JSONEq(t, `{"type":"message"}`, string(got[0].Body))
	require.NotEmpty(t, got[1].Problem)
	require.NotEmpty(t, got[2].Problem)
	require.Equal(t, "b", got[2].CustomID)
	require.Equal(t, providerbatch.RequestExpired, got[3].Err.Kind)

	stop := errors.New("stop")
	calls := 0
	err := b.Results(t.Context(), "msgbatch_1", func(providerbatch.Result) error {
		calls++
		return stop
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, 1, calls)
	require.Error(t, b.Results(t.Context(), "", func(providerbatch.Result) error { return nil }))
}

// Each shape of a results line reads as its result: an answer, an error of
// each type the Messages API documents (refused or failed as its HTTP
// status would be), an error llmq cannot read (failed, never refused),
// a request the batch did not run, and lines that cannot be read.
func TestParseResultLine(t *testing.T) {
	t.Parallel()
	errored := func(typ string) string {
		return `{"custom_id":"e","result":{"type":"errored","error":{"type":"error","error":{"type":"` + typ + `","message":"m"},"request_id":"req_1"}}}`
	}
	for _, tc := range []struct {
		name, line string
		want       providerbatch.Result
	}{
		{"answer", `{"custom_id":"a","result":{"type":"succeeded","message":{"id":"msg_1", "type":"message","content":[]}}}`,
			providerbatch.Result{CustomID: "a", Body: json.RawMessage(`{"id":"msg_1", "type":"message","content":[]}`)}},
		{"expired", `{"custom_id":"x","result":{"type":"expired"}}`,
			providerbatch.Result{CustomID: "x", Err: &providerbatch.RequestError{Kind: providerbatch.RequestExpired, Code: "expired", Message: "the batch expired before the request ran"}}},
		{"canceled", `{"custom_id":"c","result":{"type":"canceled"}}`,
			providerbatch.Result{CustomID: "c", Err: &providerbatch.RequestError{Kind: providerbatch.RequestCancelled, Code: "canceled", Message: "the batch was cancelled before the request ran"}}},
		{"unknown error type", errored("brand_new_error"),
			providerbatch.Result{CustomID: "e", Err: &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Code: "brand_new_error", Message: "m"}}},
		{"unreadable error", `{"custom_id":"e","result":{"type":"errored","error":"gone"}}`,
			providerbatch.Result{CustomID: "e", Err: &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Message: `"gone"`}}},
	} {
		require.Equal(t, tc.want, llmqanthropic.ParseResultLine([]byte(tc.line)), tc.name)
	}
	for typ, want := range map[string]providerbatch.RequestError{
		"invalid_request_error": {Kind: providerbatch.RequestRefused, Status: 400},
		"authentication_error":  {Kind: providerbatch.RequestRefused, Status: 401},
		"billing_error":         {Kind: providerbatch.RequestRefused, Status: 402},
		"permission_error":      {Kind: providerbatch.RequestRefused, Status: 403},
		"not_found_error":       {Kind: providerbatch.RequestRefused, Status: 404},
		"request_too_large":     {Kind: providerbatch.RequestRefused, Status: 413},
		"rate_limit_error":      {Kind: providerbatch.RequestFailed, Status: 429},
		"api_error":             {Kind: providerbatch.RequestFailed, Status: 500},
		"timeout_error":         {Kind: providerbatch.RequestFailed, Status: 504},
		"overloaded_error":      {Kind: providerbatch.RequestFailed, Status: 529},
	} {
		want.Code, want.Message = typ, "m"
		require.Equal(t, providerbatch.Result{CustomID: "e", Err: &want}, llmqanthropic.ParseResultLine([]byte(errored(typ))), typ)
	}
	for _, line := range []string{
		`not json`, `[]`, `null`, `{"result":{"type":"expired"}}`, `{"custom_id":"g"}`,
		`{"custom_id":"g","result":{"type":"succeeded"}}`, `{"custom_id":"g","result":{"type":"succeeded","message":null}}`,
		`{"custom_id":"g","result":{"type":"processing"}}`, `{"custom_id":"g","result":{}}`,
	} {
		got := llmqanthropic.ParseResultLine([]byte(line))
		require.NotEmpty(t, got.Problem, "line %s", line)
		require.Nil(t, got.Err, "line %s", line)
		require.Nil(t, got.Body, "line %s", line)
	}
}

// No line, however malformed, panics; a line read without a problem names
// its request and has exactly one of an answer or an error, and a line
// with a problem has neither.
func FuzzParseResultLine(f *testing.F) {
	for _, seed := range []string{
		`{"custom_id":"a","result":{"type":"succeeded","message":{"type":"message","content":[]}}}`,
		`{"custom_id":"e","result":{"type":"errored","error":{"type":"error","error":{"type":"api_error","message":"m"}}}}`,
		`{"custom_id":"e","result":{"type":"errored","error":{"error":{"type":5}}}}`,
		`{"custom_id":"x","result":{"type":"expired"}}`, `{"custom_id":"c","result":{"type":"canceled"}}`,
		`{"custom_id":"","result":null}`, `{"custom_id":"s","result":{"type":"succeeded","message":null}}`,
		`null`, `{`, `[]`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r := llmqanthropic.ParseResultLine(line)
		if r.Problem != "" {
			require.Nil(t, r.Body, "line %q read as %+v", line, r)
			require.Nil(t, r.Err, "line %q read as %+v", line, r)
			return
		}
		require.NotEmpty(t, r.CustomID, "line %q read as %+v", line, r)
		require.NotEqual(t, r.Body != nil, r.Err != nil, "line %q read as %+v", line, r)
		if r.Body != nil {
			require.True(t, json.Valid(r.Body), "line %q read as %+v", line, r)
		}
	})
}

// The codec's request body is the one the batch params' type would send,
// its answer is the SDK's message, and its usage counts the cache's input
// tokens as the synchronous path's Usage does.
func TestMessagesCodec(t *testing.T) {
	t.Parallel()
	var c llmqanthropic.Messages
	require.Equal(t, "anthropic", c.Provider())
	req := messageParams("hello")
	require.Equal(t, "claude-test", c.Model(req))
	body, err := c.Encode(req)
	require.NoError(t, err)
	asBatch, err := json.Marshal(sdk.MessageBatchNewParamsRequestParams{Model: req.Model, MaxTokens: req.MaxTokens, System: req.System, Messages: req.Messages})
	require.NoError(t, err)
	require.JSONEq(t, string(asBatch), string(body))

	req.WorkspaceID = sdk.String("wrkspc_1")
	_, err = c.Encode(req)
	require.ErrorContains(t, err, "WorkspaceID")

	answer := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":7,"cache_creation_input_tokens":5,"cache_read_input_tokens":3,"output_tokens":4}}`
	msg, err := c.Decode(json.RawMessage(answer))
	require.NoError(t, err)
	require.Equal(t, "hi", msg.Content[0].Text)
	require.Equal(t, answer, msg.RawJSON())
	usage := c.Usage(msg)
	require.Equal(t, int64(15), usage.InputTokens)
	require.Equal(t, int64(4), usage.OutputTokens)
	syncUsage, ok := llmqanthropic.Usage([]byte(answer))
	require.True(t, ok)
	require.Equal(t, syncUsage, usage, "the batch path counts as the synchronous one")

	for _, bad := range []string{`[1]`, `"x"`, `null`, `{}`, `{"type":"error","error":{}}`, `{"type":"message","content":5}`, `{`} {
		_, err := c.Decode(json.RawMessage(bad))
		require.Error(t, err, bad)
	}
}
