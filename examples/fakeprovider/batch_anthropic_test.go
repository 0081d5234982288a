package fakeprovider_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/fakeprovider"
)

// anthropicClient is an anthropic-sdk-go client on the fake at url that
// never retries, authenticated by auth (option.WithAPIKey or WithAuthToken).
func anthropicClient(url string, auth option.RequestOption) sdk.Client {
	return sdk.NewClient(option.WithBaseURL(url), auth, option.WithMaxRetries(0))
}

// message is one request of a Message Batch about text; without text it
// has no max_tokens, which the Messages API refuses.
func message(id, text string) sdk.MessageBatchNewParamsRequest {
	params := sdk.MessageBatchNewParamsRequestParams{
		Model: "claude-test", System: []sdk.TextBlockParam{{Text: "extract"}},
		Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(cmpOr(text, doc)))},
	}
	if text != "" {
		params.MaxTokens = 800
	}
	return sdk.MessageBatchNewParamsRequest{CustomID: id, Params: params}
}

func newMessageBatch(t *testing.T, c sdk.Client, requests ...sdk.MessageBatchNewParamsRequest) (*sdk.MessageBatch, error) {
	t.Helper()
	return c.Messages.Batches.New(t.Context(), sdk.MessageBatchNewParams{Requests: requests})
}

func getMessageBatch(t *testing.T, c sdk.Client, id string) *sdk.MessageBatch {
	t.Helper()
	b, err := c.Messages.Batches.Get(t.Context(), id, sdk.MessageBatchGetParams{})
	require.NoError(t, err)
	return b
}

// results reads a batch's results by custom id.
func results(t *testing.T, c sdk.Client, id string) map[string]sdk.MessageBatchResultUnion {
	t.Helper()
	stream := c.Messages.Batches.ResultsStreaming(t.Context(), id, sdk.MessageBatchResultsParams{})
	defer stream.Close()
	out := map[string]sdk.MessageBatchResultUnion{}
	for stream.Next() {
		out[stream.Current().CustomID] = stream.Current().Result
	}
	require.NoError(t, stream.Err())
	return out
}

func anthropicStatus(t *testing.T, err error) int {
	t.Helper()
	var e *sdk.Error
	require.ErrorAs(t, err, &e)
	return e.StatusCode
}

// A Message Batch's requests are answered by the same fake model once it
// ends: succeeded with the Messages API's answer, or errored with its
// error body; its results are JSONL at its results_url. The key that
// created it, x-api-key or bearer, is the one OnCall sees.
func TestMessageBatch(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		created []fakeprovider.BatchCreated
		calls   []fakeprovider.Call
	)
	srv, url := batchServer(t, fakeprovider.Config{
		BatchDelay:    time.Nanosecond,
		OnBatchCreate: func(b fakeprovider.BatchCreated) { mu.Lock(); created = append(created, b); mu.Unlock() },
		OnCall:        func(c fakeprovider.Call) { mu.Lock(); calls = append(calls, c); mu.Unlock() },
	})
	srv.HoldBatches()
	c := anthropicClient(url, option.WithAPIKey("key-a"))

	b, err := newMessageBatch(t, c, message("ok", doc), message("refused", doc+"[[fake:batch-400]]"),
		message("failed", doc+"[[fake:batch-500]]"), message("malformed", doc+"[[fake:malformed]]"), message("no-max-tokens", ""))
	require.NoError(t, err)
	require.Equal(t, sdk.MessageBatchProcessingStatusInProgress, b.ProcessingStatus)
	require.Equal(t, int64(5), b.RequestCounts.Processing)
	require.Empty(t, b.ResultsURL)
	require.True(t, b.EndedAt.IsZero())
	require.Equal(t, b.CreatedAt.Add(24*time.Hour), b.ExpiresAt)
	mu.Lock()
	require.Equal(t, []fakeprovider.BatchCreated{{API: "anthropic", ID: b.ID, Requests: 5}}, created)
	mu.Unlock()

	stream := c.Messages.Batches.ResultsStreaming(t.Context(), b.ID, sdk.MessageBatchResultsParams{})
	require.False(t, stream.Next())
	require.Equal(t, http.StatusBadRequest, anthropicStatus(t, stream.Err()), "no results before the batch ends")

	srv.ReleaseBatches()
	b = getMessageBatch(t, c, b.ID)
	require.Equal(t, sdk.MessageBatchProcessingStatusEnded, b.ProcessingStatus)
	require.Equal(t, url+"/v1/messages/batches/"+b.ID+"/results", b.ResultsURL)
	require.False(t, b.EndedAt.IsZero())
	require.Equal(t, sdk.MessageBatchRequestCounts{Succeeded: 2, Errored: 3}, sdk.MessageBatchRequestCounts{
		Processing: b.RequestCounts.Processing, Succeeded: b.RequestCounts.Succeeded, Errored: b.RequestCounts.Errored,
		Canceled: b.RequestCounts.Canceled, Expired: b.RequestCounts.Expired,
	})

	res := results(t, c, b.ID)
	require.Len(t, res, 5)
	require.Equal(t, "succeeded", res["ok"].Type)
	msg := res["ok"].AsSucceeded().Message
	var ex fakeprovider.Extraction
	require.NoError(t, json.Unmarshal([]byte(msg.Content[0].Text), &ex))
	require.Equal(t, "DE89370400440532013000", ex.IBAN)
	require.Positive(t, msg.Usage.InputTokens)
	require.Equal(t, "succeeded", res["malformed"].Type)
	var syntax *json.SyntaxError
	require.ErrorAs(t, json.Unmarshal([]byte(res["malformed"].AsSucceeded().Message.Content[0].Text), &ex), &syntax)
	for id, typ := range map[string]string{"refused": "invalid_request_error", "failed": "api_error", "no-max-tokens": "invalid_request_error"} {
		require.Equal(t, "errored", res[id].Type, id)
		e := res[id].AsErrored().Error
		require.Equal(t, "error", string(e.Type), id)
		require.Equal(t, typ, e.Error.Type, id)
	}
	require.Contains(t, res["no-max-tokens"].AsErrored().Error.Error.Message, "max_tokens")

	bearer := anthropicClient(url, option.WithAuthToken("token-a"))
	srv.HoldBatches()
	b, err = newMessageBatch(t, bearer, message("ok", doc))
	require.NoError(t, err)
	require.Equal(t, 1, srv.AdvanceBatches(1))
	require.Equal(t, "succeeded", results(t, bearer, b.ID)["ok"].Type)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 6)
	for _, call := range calls[:5] {
		require.Equal(t, "anthropic-batch", call.API)
		require.Equal(t, "key-a", call.APIKey)
	}
	require.Equal(t, "token-a", calls[5].APIKey)
	st := srv.Stats()
	require.Equal(t, int64(2), st.BatchesCreated)
	require.Equal(t, int64(3), st.BatchRequestsAnswered)
	require.Equal(t, int64(3), st.BatchRequestsErrored)
}

// Batches Anthropic would refuse are refused with 400
// invalid_request_error, each named in the error, and counted.
func TestMessageBatchRefused(t *testing.T) {
	t.Parallel()
	srv, url := batchServer(t, fakeprovider.Config{AnthropicBatchMaxRequests: 2, AnthropicBatchMaxBytes: 3000})
	c := anthropicClient(url, option.WithAPIKey("key-a"))
	for _, tc := range []struct {
		name     string
		requests []sdk.MessageBatchNewParamsRequest
		want     string
	}{
		{"over the requests", []sdk.MessageBatchNewParamsRequest{message("a", doc), message("b", doc), message("c", doc)}, "over the limit of 2"},
		{"over the bytes", []sdk.MessageBatchNewParamsRequest{message("a", strings.Repeat(doc, 20))}, "over the limit of 3000"},
		{"duplicate custom_id", []sdk.MessageBatchNewParamsRequest{message("a", doc), message("a", doc)}, `"a" is requests.0's too`},
		{"bad custom_id", []sdk.MessageBatchNewParamsRequest{message("job:1", doc)}, `custom_id "job:1"`},
		{"no requests", nil, "at least one request"},
	} {
		_, err := newMessageBatch(t, c, tc.requests...)
		var e *sdk.Error
		require.ErrorAs(t, err, &e, tc.name)
		require.Equal(t, http.StatusBadRequest, e.StatusCode, tc.name)
		require.Equal(t, "invalid_request_error", string(e.Type()), tc.name)
		require.Contains(t, e.Message, tc.want, tc.name)
	}
	require.Equal(t, int64(5), srv.Stats().BatchesRefused)
	require.Zero(t, srv.Stats().BatchesCreated)
}

// A canceled batch is "canceling" until its next read, then ended with its
// requests "canceled"; ExpireBatches ends running batches with their
// requests "expired". Batches list newest first, a page at a time.
func TestMessageBatchCancelExpiryAndList(t *testing.T) {
	t.Parallel()
	srv, url := batchServer(t, fakeprovider.Config{})
	srv.HoldBatches()
	c := anthropicClient(url, option.WithAPIKey("key-a"))
	var ids []string
	for range 3 {
		b, err := newMessageBatch(t, c, message("a", doc), message("b", doc))
		require.NoError(t, err)
		ids = append([]string{b.ID}, ids...)
	}
	canceled := ids[2]

	b, err := c.Messages.Batches.Cancel(t.Context(), canceled, sdk.MessageBatchCancelParams{})
	require.NoError(t, err)
	require.Equal(t, sdk.MessageBatchProcessingStatusCanceling, b.ProcessingStatus)
	require.False(t, b.CancelInitiatedAt.IsZero())
	b = getMessageBatch(t, c, canceled)
	require.Equal(t, sdk.MessageBatchProcessingStatusEnded, b.ProcessingStatus)
	require.Equal(t, int64(2), b.RequestCounts.Canceled)
	require.Equal(t, "canceled", results(t, c, canceled)["a"].Type)

	require.Equal(t, 2, srv.ExpireBatches())
	b = getMessageBatch(t, c, ids[0])
	require.Equal(t, sdk.MessageBatchProcessingStatusEnded, b.ProcessingStatus)
	require.Equal(t, int64(2), b.RequestCounts.Expired)
	require.Equal(t, "expired", results(t, c, ids[0])["b"].Type)
	_, err = c.Messages.Batches.Cancel(t.Context(), ids[0], sdk.MessageBatchCancelParams{})
	require.Equal(t, http.StatusBadRequest, anthropicStatus(t, err), "an ended batch cannot be canceled")
	_, err = c.Messages.Batches.Get(t.Context(), "msgbatch_nope", sdk.MessageBatchGetParams{})
	require.Equal(t, http.StatusNotFound, anthropicStatus(t, err))

	page, err := c.Messages.Batches.List(t.Context(), sdk.MessageBatchListParams{Limit: sdk.Int(2)})
	require.NoError(t, err)
	require.True(t, page.HasMore)
	require.Equal(t, ids[0], page.FirstID)
	require.Equal(t, ids[1], page.LastID)
	require.Equal(t, ids[:2], messageBatchIDs(page.Data))
	page, err = page.GetNextPage()
	require.NoError(t, err)
	require.False(t, page.HasMore)
	require.Equal(t, ids[2:], messageBatchIDs(page.Data))
	page, err = c.Messages.Batches.List(t.Context(), sdk.MessageBatchListParams{BeforeID: sdk.String(ids[2]), Limit: sdk.Int(1)})
	require.NoError(t, err)
	require.Equal(t, ids[1:2], messageBatchIDs(page.Data))
	require.True(t, page.HasMore)

	var all []string
	pager := c.Messages.Batches.ListAutoPaging(t.Context(), sdk.MessageBatchListParams{Limit: sdk.Int(1)})
	for pager.Next() {
		all = append(all, pager.Current().ID)
	}
	require.NoError(t, pager.Err())
	require.Equal(t, ids, all)
	st := srv.Stats()
	require.Equal(t, int64(2), st.BatchRequestsCancelled)
	require.Equal(t, int64(4), st.BatchRequestsExpired)
}

func messageBatchIDs(batches []sdk.MessageBatch) []string {
	var ids []string
	for _, b := range batches {
		ids = append(ids, b.ID)
	}
	return ids
}
