package fakeprovider_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/fakeprovider"
)

// batchServer serves a fake provider for cfg and returns it with its URL.
// Without a Scale of its own the fake runs at 15,000 times (a 40ms batch
// delay).
func batchServer(t *testing.T, cfg fakeprovider.Config) (*fakeprovider.Server, string) {
	t.Helper()
	if cfg.Scale == 0 {
		cfg.Scale = 15_000
	}
	srv := fakeprovider.New(cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return srv, hs.URL
}

// openAIClient is an openai-go client on the fake at url, which never
// retries: a test sees each answer as the fake gave it.
func openAIClient(url string) oai.Client {
	return oai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("key-b"), option.WithMaxRetries(0))
}

// chat is one request of an input file: custom id, model and document.
type chat struct{ id, model, doc string }

// inputFile is a JSONL input file of chat requests as a batch client
// writes it: each body an SDK request. A chat without a document has no
// messages, which the fake refuses.
func inputFile(t *testing.T, chats ...chat) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, c := range chats {
		params := oai.ChatCompletionNewParams{Model: cmpOr(c.model, "gpt-test")}
		if c.doc != "" {
			params.Messages = []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("extract"), oai.UserMessage(c.doc)}
		}
		body, err := json.Marshal(params)
		require.NoError(t, err)
		require.NoError(t, enc.Encode(map[string]any{"custom_id": c.id, "method": "POST", "url": "/v1/chat/completions", "body": json.RawMessage(body)}))
	}
	return buf.Bytes()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// createBatch uploads content and creates a batch on it.
func createBatch(t *testing.T, c oai.Client, content []byte, metadata shared.Metadata) (*oai.Batch, error) {
	t.Helper()
	f, err := c.Files.New(t.Context(), oai.FileNewParams{File: oai.File(bytes.NewReader(content), "in.jsonl", "application/jsonl"), Purpose: oai.FilePurposeBatch})
	require.NoError(t, err)
	require.Equal(t, int64(len(content)), f.Bytes)
	return c.Batches.New(t.Context(), oai.BatchNewParams{
		InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h, Metadata: metadata,
	})
}

func mustCreate(t *testing.T, c oai.Client, chats ...chat) *oai.Batch {
	t.Helper()
	b, err := createBatch(t, c, inputFile(t, chats...), nil)
	require.NoError(t, err)
	return b
}

func getBatch(t *testing.T, c oai.Client, id string) *oai.Batch {
	t.Helper()
	b, err := c.Batches.Get(t.Context(), id)
	require.NoError(t, err)
	return b
}

// resultLine is a line of an output or error file.
type resultLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// readResults reads the file id's lines by custom id; "" reads none.
func readResults(t *testing.T, c oai.Client, id string) map[string]resultLine {
	t.Helper()
	lines := map[string]resultLine{}
	if id == "" {
		return lines
	}
	resp, err := c.Files.Content(t.Context(), id)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for raw := range bytes.Lines(body) {
		var l resultLine
		require.NoError(t, json.Unmarshal(raw, &l), "%s", raw)
		lines[l.CustomID] = l
	}
	return lines
}

// apiError is err as the SDK's *oai.Error, whose status and message a
// test checks.
func apiError(t *testing.T, err error) *oai.Error {
	t.Helper()
	var e *oai.Error
	require.ErrorAs(t, err, &e)
	return e
}

// A batch's requests are answered by the same fake model as the
// synchronous path, once the batch completes at a read after its delay:
// answers in the output file, refusals and failures in the error file,
// each as OpenAI writes them. Metadata round-trips, and the hooks see the
// create and each request answered.
func TestOpenAIBatch(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		created  []fakeprovider.BatchCreated
		answered []fakeprovider.BatchRequest
		calls    []fakeprovider.Call
	)
	srv, url := batchServer(t, fakeprovider.Config{
		BatchDelay:     time.Nanosecond,
		OnBatchCreate:  func(b fakeprovider.BatchCreated) { mu.Lock(); created = append(created, b); mu.Unlock() },
		OnBatchRequest: func(r fakeprovider.BatchRequest) { mu.Lock(); answered = append(answered, r); mu.Unlock() },
		OnCall:         func(c fakeprovider.Call) { mu.Lock(); calls = append(calls, c); mu.Unlock() },
	})
	c := openAIClient(url)
	srv.HoldBatches()

	content := inputFile(t, chat{id: "ok", doc: doc}, chat{id: "refused", doc: doc + "[[fake:batch-400]]"},
		chat{id: "failed", doc: doc + "[[fake:batch-500]]"}, chat{id: "malformed", doc: doc + "[[fake:malformed]]"},
		chat{id: "empty"})
	b, err := createBatch(t, c, content, shared.Metadata{"llmq_submission": "s-1"})
	require.NoError(t, err)
	require.Equal(t, oai.BatchStatusValidating, b.Status)
	require.Equal(t, "gpt-test", b.Model)
	require.Equal(t, shared.Metadata{"llmq_submission": "s-1"}, b.Metadata)
	mu.Lock()
	require.Equal(t, []fakeprovider.BatchCreated{{API: "openai", ID: b.ID, Requests: 5, Metadata: map[string]string{"llmq_submission": "s-1"}}}, created)
	mu.Unlock()

	held := getBatch(t, c, b.ID)
	require.Equal(t, oai.BatchStatusInProgress, held.Status, "held past its delay")
	require.Equal(t, int64(5), held.RequestCounts.Total)
	require.Empty(t, held.OutputFileID)

	srv.ReleaseBatches()
	done := getBatch(t, c, b.ID)
	require.Equal(t, oai.BatchStatusCompleted, done.Status)
	require.Equal(t, [3]int64{5, 2, 3}, [3]int64{done.RequestCounts.Total, done.RequestCounts.Completed, done.RequestCounts.Failed}, "total, completed, failed")
	require.Equal(t, shared.Metadata{"llmq_submission": "s-1"}, done.Metadata)
	require.NotZero(t, done.CompletedAt)
	require.Positive(t, done.Usage.InputTokens)

	out := readResults(t, c, done.OutputFileID)
	require.Len(t, out, 2)
	require.Nil(t, out["ok"].Error)
	require.Equal(t, http.StatusOK, out["ok"].Response.StatusCode)
	require.True(t, strings.HasPrefix(out["ok"].ID, "batch_req_"), out["ok"].ID)
	require.NotEmpty(t, out["ok"].Response.RequestID)
	var completion oai.ChatCompletion
	require.NoError(t, json.Unmarshal(out["ok"].Response.Body, &completion))
	var ex fakeprovider.Extraction
	require.NoError(t, json.Unmarshal([]byte(completion.Choices[0].Message.Content), &ex))
	require.Equal(t, "DE89370400440532013000", ex.IBAN)
	require.Positive(t, completion.Usage.PromptTokens)
	require.NoError(t, json.Unmarshal(out["malformed"].Response.Body, &completion))
	var syntax *json.SyntaxError
	require.ErrorAs(t, json.Unmarshal([]byte(completion.Choices[0].Message.Content), &ex), &syntax, "a 200 whose content is malformed")

	errs := readResults(t, c, done.ErrorFileID)
	require.Len(t, errs, 3)
	for id, want := range map[string]struct {
		status int
		typ    string
	}{"refused": {400, "invalid_request_error"}, "failed": {500, "server_error"}, "empty": {400, "invalid_request_error"}} {
		var body struct {
			Error struct{ Type, Message string } `json:"error"`
		}
		require.Equal(t, want.status, errs[id].Response.StatusCode, id)
		require.NoError(t, json.Unmarshal(errs[id].Response.Body, &body), id)
		require.Equal(t, want.typ, body.Error.Type, id)
	}
	require.Contains(t, string(errs["empty"].Response.Body), "messages")

	resp, err := c.Files.Content(t.Context(), done.InputFileID)
	if resp != nil {
		resp.Body.Close()
	}
	require.Equal(t, http.StatusBadRequest, apiError(t, err).StatusCode, "OpenAI gives no input file back")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, answered, 5)
	require.Len(t, calls, 5)
	byID := map[string]fakeprovider.BatchRequest{}
	for _, r := range answered {
		require.Equal(t, b.ID, r.BatchID)
		require.Equal(t, "openai-batch", r.API)
		require.Equal(t, "key-b", r.APIKey)
		byID[r.CustomID] = r
	}
	require.Equal(t, "bad-request", byID["refused"].Fault)
	require.Equal(t, "server-error", byID["failed"].Fault)
	require.Equal(t, "malformed", byID["malformed"].Fault)
	require.Equal(t, http.StatusOK, byID["ok"].Status)
	require.Equal(t, doc, byID["ok"].Document)
	st := srv.Stats()
	require.Equal(t, int64(1), st.BatchesCreated)
	require.Equal(t, int64(2), st.BatchRequestsAnswered)
	require.Equal(t, int64(3), st.BatchRequestsErrored)
	require.Zero(t, st.Calls, "batch requests are not synchronous calls")
}

// A batch completes at the first read after its delay (10 minutes
// divided by Scale), or when AdvanceBatches completes it, oldest first.
func TestOpenAIBatchDelayAndAdvance(t *testing.T) {
	t.Parallel()
	srv, url := batchServer(t, fakeprovider.Config{Scale: 1})
	c := openAIClient(url)
	first, second, third := mustCreate(t, c, chat{id: "a", doc: doc}), mustCreate(t, c, chat{id: "a", doc: doc}), mustCreate(t, c, chat{id: "a", doc: doc})
	require.Equal(t, oai.BatchStatusInProgress, getBatch(t, c, first.ID).Status, "10 minutes have not passed")

	require.Equal(t, 2, srv.AdvanceBatches(2))
	require.Equal(t, oai.BatchStatusCompleted, getBatch(t, c, first.ID).Status)
	require.Equal(t, oai.BatchStatusCompleted, getBatch(t, c, second.ID).Status)
	require.Equal(t, oai.BatchStatusInProgress, getBatch(t, c, third.ID).Status)
	require.Equal(t, 1, srv.AdvanceBatches(5))
	require.Equal(t, 0, srv.AdvanceBatches(5))
	require.Equal(t, oai.BatchStatusCompleted, getBatch(t, c, third.ID).Status)
}

// Files and batches OpenAI would refuse are refused with 400, each named
// in the error, and counted.
func TestOpenAIBatchRefused(t *testing.T) {
	t.Parallel()
	srv, url := batchServer(t, fakeprovider.Config{OpenAIBatchMaxFileBytes: 1500, OpenAIBatchMaxRequests: 3})
	c := openAIClient(url)
	small := chat{id: "a", doc: "Total: 1.00"}
	line := func(s string) []byte { return []byte(s + "\n") }
	for _, tc := range []struct {
		name    string
		content []byte
		want    string
	}{
		{"over the bytes", inputFile(t, chat{id: "a", doc: strings.Repeat(doc, 8)}), "over the limit of 1500"},
		{"over the requests", inputFile(t, small, chat{id: "b", doc: small.doc}, chat{id: "c", doc: small.doc}, chat{id: "d", doc: small.doc}), "more than 3 requests"},
		{"duplicate custom_id", inputFile(t, small, small), `custom_id "a" is line 1's too`},
		{"bad JSON", append(inputFile(t, small), line(`{"custom_id": "b",`)...), "line 2: not a JSON request"},
		{"wrong url", line(`{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"m"}}`), `url "/v1/embeddings"`},
		{"two models", inputFile(t, small, chat{id: "b", model: "other", doc: small.doc}), "a batch has one model"},
		{"empty", nil, "has no requests"},
	} {
		_, err := createBatch(t, c, tc.content, nil)
		e := apiError(t, err)
		require.Equal(t, http.StatusBadRequest, e.StatusCode, tc.name)
		require.Contains(t, e.Message, tc.want, tc.name)
	}
	_, err := c.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: "file-nope", Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	require.Contains(t, apiError(t, err).Message, `"file-nope": no such file`)
	require.Equal(t, int64(8), srv.Stats().BatchesRefused)
	require.Zero(t, srv.Stats().BatchesCreated)
}

// Past the enqueued-token limit of its model, a batch is created but
// fails, as OpenAI fails it; other models' batches, and this model's once
// the queue drains, still run.
func TestOpenAIEnqueuedTokenLimit(t *testing.T) {
	t.Parallel()
	perBatch := int64((len("extract")+len(doc))/4 + 1) // a quarter of the prompt's characters
	srv, url := batchServer(t, fakeprovider.Config{OpenAIEnqueuedTokenLimit: perBatch * 3 / 2})
	srv.HoldBatches()
	c := openAIClient(url)
	first := mustCreate(t, c, chat{id: "a", doc: doc})
	over := mustCreate(t, c, chat{id: "a", doc: doc})
	require.Equal(t, oai.BatchStatusValidating, over.Status, "the create succeeds")
	other := mustCreate(t, c, chat{id: "a", model: "other", doc: doc})

	failed := getBatch(t, c, over.ID)
	require.Equal(t, oai.BatchStatusFailed, failed.Status)
	require.Len(t, failed.Errors.Data, 1)
	require.Equal(t, "token_limit_exceeded", failed.Errors.Data[0].Code)
	require.Contains(t, failed.Errors.Data[0].Message, "gpt-test")
	require.Zero(t, failed.RequestCounts.Total)
	require.NotZero(t, failed.FailedAt)
	require.Equal(t, oai.BatchStatusInProgress, getBatch(t, c, first.ID).Status)
	require.Equal(t, oai.BatchStatusInProgress, getBatch(t, c, other.ID).Status)

	require.Equal(t, 2, srv.AdvanceBatches(2))
	again := mustCreate(t, c, chat{id: "a", doc: doc})
	require.Equal(t, oai.BatchStatusInProgress, getBatch(t, c, again.ID).Status)
	st := srv.Stats()
	require.Equal(t, int64(4), st.BatchesCreated)
	require.Equal(t, int64(1), st.BatchesRefused)
}

// A cancelled batch is "cancelling" until its next read, then "cancelled"
// with its requests in the error file; ExpireBatches expires every running
// batch, its requests "batch_expired". An ended batch cannot be cancelled.
func TestOpenAIBatchCancelAndExpiry(t *testing.T) {
	t.Parallel()
	srv, url := batchServer(t, fakeprovider.Config{})
	srv.HoldBatches()
	c := openAIClient(url)
	cancelled := mustCreate(t, c, chat{id: "a", doc: doc}, chat{id: "b", doc: doc})
	expired := mustCreate(t, c, chat{id: "a", doc: doc})

	b, err := c.Batches.Cancel(t.Context(), cancelled.ID)
	require.NoError(t, err)
	require.Equal(t, oai.BatchStatusCancelling, b.Status)
	require.NotZero(t, b.CancellingAt)
	b = getBatch(t, c, cancelled.ID)
	require.Equal(t, oai.BatchStatusCancelled, b.Status)
	require.NotZero(t, b.CancelledAt)
	require.Empty(t, b.OutputFileID)
	lines := readResults(t, c, b.ErrorFileID)
	require.Len(t, lines, 2)
	require.Equal(t, "batch_cancelled", lines["a"].Error.Code)
	require.Nil(t, lines["a"].Response)

	require.Equal(t, 1, srv.ExpireBatches())
	b = getBatch(t, c, expired.ID)
	require.Equal(t, oai.BatchStatusExpired, b.Status)
	require.NotZero(t, b.ExpiredAt)
	require.Equal(t, "batch_expired", readResults(t, c, b.ErrorFileID)["a"].Error.Code)

	_, err = c.Batches.Cancel(t.Context(), expired.ID)
	require.Equal(t, http.StatusConflict, apiError(t, err).StatusCode)
	_, err = c.Batches.Get(t.Context(), "batch_nope")
	require.Equal(t, http.StatusNotFound, apiError(t, err).StatusCode)
	st := srv.Stats()
	require.Equal(t, int64(2), st.BatchRequestsCancelled)
	require.Equal(t, int64(1), st.BatchRequestsExpired)
	require.Zero(t, st.BatchRequestsAnswered)
}

// Batches list newest first, a page at a time after the last id.
func TestOpenAIBatchList(t *testing.T) {
	t.Parallel()
	_, url := batchServer(t, fakeprovider.Config{})
	c := openAIClient(url)
	var ids []string
	for range 5 {
		ids = append([]string{mustCreate(t, c, chat{id: "a", doc: doc}).ID}, ids...)
	}

	page, err := c.Batches.List(t.Context(), oai.BatchListParams{Limit: oai.Int(2)})
	require.NoError(t, err)
	require.True(t, page.HasMore)
	require.Equal(t, ids[:2], batchIDs(page.Data))
	var cursor struct {
		FirstID string `json:"first_id"`
		LastID  string `json:"last_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(page.RawJSON()), &cursor))
	require.Equal(t, ids[0], cursor.FirstID)
	require.Equal(t, ids[1], cursor.LastID)

	page, err = page.GetNextPage()
	require.NoError(t, err)
	require.Equal(t, ids[2:4], batchIDs(page.Data))
	page, err = c.Batches.List(t.Context(), oai.BatchListParams{After: oai.String(ids[3]), Limit: oai.Int(2)})
	require.NoError(t, err)
	require.False(t, page.HasMore)
	require.Equal(t, ids[4:], batchIDs(page.Data))

	var all []string
	pager := c.Batches.ListAutoPaging(t.Context(), oai.BatchListParams{Limit: oai.Int(2)})
	for pager.Next() {
		all = append(all, pager.Current().ID)
	}
	require.NoError(t, pager.Err())
	require.Equal(t, ids, all)
}

func batchIDs(batches []oai.Batch) []string {
	var ids []string
	for _, b := range batches {
		ids = append(ids, b.ID)
	}
	return ids
}
