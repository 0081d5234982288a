package anthropic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/provider/internal/adapt"
	"github.com/llmq/llmq/providerbatch"
)

// Messages is the codec of the Messages API, for providerbatch.NewCall: a
// request is an sdk.MessageNewParams, an answer an *sdk.Message, in a
// batch as on the synchronous path. Its zero value is ready.
type Messages struct{}

// Provider implements providerbatch.Codec.
func (Messages) Provider() string { return dialect.Name }

// Model implements providerbatch.Codec.
func (Messages) Model(req sdk.MessageNewParams) string { return req.Model }

// Encode implements providerbatch.Codec: the params' JSON body, as the SDK
// sends it. A request that sets WorkspaceID or UserProfileID is refused:
// those travel as headers, which a batch request has none of, and sending
// it without them would run it elsewhere than the synchronous path does.
// Set them on the batch client instead (option.WithHeader).
func (Messages) Encode(req sdk.MessageNewParams) (json.RawMessage, error) {
	if !param.IsOmitted(req.WorkspaceID) || !param.IsOmitted(req.UserProfileID) {
		return nil, errors.New("the request sets WorkspaceID or UserProfileID, headers a batch request cannot carry")
	}
	return json.Marshal(req)
}

// Decode implements providerbatch.Codec. An answer whose type is not
// "message", or whose content is not a list, is not a message.
func (Messages) Decode(body json.RawMessage) (*sdk.Message, error) {
	// The SDK's decoder takes almost anything (an array, a string, null)
	// as an empty message without an error: the shape is checked first.
	var shape struct {
		Type    string            `json:"type"`
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(body, &shape); err != nil {
		return nil, err
	}
	if shape.Type != "message" {
		return nil, fmt.Errorf("the answer's type is %q, not \"message\"", shape.Type)
	}
	var m sdk.Message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Usage implements providerbatch.Codec, counting as Usage does: input
// tokens include the cache's.
func (Messages) Usage(resp *sdk.Message) jobs.Usage {
	u := resp.Usage
	return jobs.Usage{
		InputTokens:  adapt.Tokens(u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens),
		OutputTokens: adapt.Tokens(u.OutputTokens),
	}
}

// Anthropic's limits on one Message Batch.
const (
	maxBatchRequests = 100_000
	maxBatchBytes    = 256 << 20
)

// BatchesConfig configures Batches. It holds nothing yet: Message Batches
// have no enqueued-token limit to declare (OpenAI's has), and
// providerbatch.Config.Limits lowers the per-batch limits. Its zero value
// is the default.
type BatchesConfig struct{}

// Batches is Anthropic's Message Batches API as a providerbatch.Provider:
// a batch is one create call holding every request, each a Messages API
// request named by its custom_id.
//
// Message Batches keep no metadata, so Find cannot recognise a batch
// llmq sent: see the package documentation on what that costs after a
// crash.
type Batches struct {
	client sdk.Client
}

// NewBatches returns the Message Batches API of client. Build client with
// Options, as for synchronous calls: its retries off, llmq owns them.
func NewBatches(client sdk.Client, _ BatchesConfig) *Batches {
	return &Batches{client: client}
}

// Name implements providerbatch.Provider.
func (b *Batches) Name() string { return dialect.Name }

// Limits implements providerbatch.Provider: 100,000 requests and 256 MB a
// batch. Message Batches have no enqueued-token limit.
func (b *Batches) Limits() providerbatch.Limits {
	return providerbatch.Limits{MaxRequests: maxBatchRequests, MaxBytes: maxBatchBytes}
}

// Create implements providerbatch.Provider. Each request's body goes as
// its params exactly as the codec encoded it: re-encoding it through the
// SDK's params type would drop any field that type does not know.
func (b *Batches) Create(ctx context.Context, batch providerbatch.Batch) (string, error) {
	params := sdk.MessageBatchNewParams{Requests: make([]sdk.MessageBatchNewParamsRequest, len(batch.Requests))}
	for i, r := range batch.Requests {
		if err := checkParams(r.Body); err != nil {
			return "", fmt.Errorf("anthropic: request %s of submission %s: %w", r.CustomID, batch.Submission, err)
		}
		params.Requests[i] = sdk.MessageBatchNewParamsRequest{
			CustomID: r.CustomID,
			Params:   param.Override[sdk.MessageBatchNewParamsRequestParams](r.Body),
		}
	}
	created, err := b.client.Messages.Batches.New(ctx, params)
	if err != nil {
		return "", fmt.Errorf("anthropic: creating the message batch of submission %s: %w", batch.Submission, err)
	}
	return created.ID, nil
}

// checkParams checks that a request's body is a Messages API request, as
// far as the fields the API requires go. The SDK's own decoder is no
// check: it takes a string or an array as empty params.
func checkParams(body json.RawMessage) error {
	var p struct {
		Model     *string           `json:"model"`
		MaxTokens *int64            `json:"max_tokens"`
		Messages  []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("the body is not a Messages API request: %w", err)
	}
	switch {
	case p.Model == nil || *p.Model == "":
		return errors.New("the body names no model")
	case p.MaxTokens == nil:
		return errors.New("the body has no max_tokens")
	case p.Messages == nil:
		return errors.New("the body has no messages")
	}
	return nil
}

// Find implements providerbatch.Provider by shape. A Message Batch
// carries nothing llmq can tag it with (no metadata; its requests'
// custom_ids can be read only from its results, once it ended), so a lost
// submission's batch is the one created since lost.Since that holds
// lost.Requests requests and that no submission of the pool recorded
// (lost.Known). None: it was not created. Several:
// providerbatch.ErrCannotFind, and the submission is sent again. The
// match assumes the workspace's batches created in that window are this
// pool's; adopting another's by mistake applies nothing of it (results
// are matched to jobs by custom_id) and returns the submission's jobs to
// waiting when it ends.
func (b *Batches) Find(ctx context.Context, lost providerbatch.Lost) ([]string, error) {
	pager := b.client.Messages.Batches.ListAutoPaging(ctx, sdk.MessageBatchListParams{Limit: sdk.Int(100)})
	var found []string
	for pager.Next() {
		batch := pager.Current()
		if batch.CreatedAt.Before(lost.Since) {
			break // newest first: the rest are older
		}
		c := batch.RequestCounts
		if c.Processing+c.Succeeded+c.Errored+c.Canceled+c.Expired == int64(lost.Requests) && !lost.Known[batch.ID] {
			found = append(found, batch.ID)
		}
	}
	if err := pager.Err(); err != nil {
		return nil, fmt.Errorf("anthropic: listing message batches: %w", err)
	}
	if len(found) > 1 {
		return nil, fmt.Errorf("%w: %d message batches of %d requests since %s", providerbatch.ErrCannotFind, len(found), lost.Requests, lost.Since.UTC().Format(time.RFC3339))
	}
	return found, nil
}

// Status implements providerbatch.Provider. A batch ends "ended" whatever
// became of its requests (expired and cancelled ones included); it never
// fails as a whole once created.
func (b *Batches) Status(ctx context.Context, id string) (providerbatch.Status, error) {
	batch, err := b.client.Messages.Batches.Get(ctx, id, sdk.MessageBatchGetParams{})
	if err != nil {
		return providerbatch.Status{}, fmt.Errorf("anthropic: reading message batch %s: %w", id, err)
	}
	return providerbatch.Status{
		State: string(batch.ProcessingStatus),
		Ended: batch.ProcessingStatus == sdk.MessageBatchProcessingStatusEnded,
	}, nil
}

// Results implements providerbatch.Provider: the batch's results file,
// read line by line with ParseResultLine. It does not use the SDK's
// ResultsStreaming, whose stream ends at the first line it cannot decode.
func (b *Batches) Results(ctx context.Context, id string, fn func(providerbatch.Result) error) error {
	if id == "" {
		return errors.New("anthropic: reading the results of a message batch: no batch id")
	}
	var resp *http.Response
	path := "v1/messages/batches/" + url.PathEscape(id) + "/results"
	if err := b.client.Get(ctx, path, nil, &resp, option.WithHeader("Accept", "application/x-jsonl")); err != nil {
		return fmt.Errorf("anthropic: reading the results of message batch %s: %w", id, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if err := providerbatch.ReadResults(resp.Body, ParseResultLine, fn); err != nil {
		return fmt.Errorf("anthropic: reading the results of message batch %s: %w", id, err)
	}
	return nil
}

// resultLine is one line of a Message Batch's results.
type resultLine struct {
	CustomID string `json:"custom_id"`
	Result   *struct {
		Type    string          `json:"type"`
		Message json.RawMessage `json:"message"`
		Error   json.RawMessage `json:"error"`
	} `json:"result"`
}

// ParseResultLine reads one line of a Message Batch's results. A line it
// cannot read, or whose result type it does not know, comes back with
// Problem set and neither Body nor Err. The others come back with their
// CustomID and exactly one of Body (the message's JSON as received) or
// Err.
func ParseResultLine(line []byte) providerbatch.Result {
	var l resultLine
	if err := json.Unmarshal(line, &l); err != nil {
		return providerbatch.Result{Problem: fmt.Sprintf("not a JSON result line: %v", err)}
	}
	res := providerbatch.Result{CustomID: l.CustomID}
	switch {
	case l.CustomID == "":
		res.Problem = "the line has no custom_id"
	case l.Result == nil:
		res.Problem = "the line has no result"
	case l.Result.Type == "succeeded":
		if isAbsent(l.Result.Message) {
			res.Problem = "the line succeeded without a message"
			break
		}
		res.Body = l.Result.Message
	case l.Result.Type == "errored":
		res.Err = erroredResult(l.Result.Error)
	case l.Result.Type == "expired":
		res.Err = &providerbatch.RequestError{Kind: providerbatch.RequestExpired, Code: "expired", Message: "the batch expired before the request ran"}
	case l.Result.Type == "canceled":
		res.Err = &providerbatch.RequestError{Kind: providerbatch.RequestCancelled, Code: "canceled", Message: "the batch was cancelled before the request ran"}
	default:
		res.Problem = fmt.Sprintf("the line's result type %q is not one llmq knows", l.Result.Type)
	}
	return res
}

func isAbsent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// errorStatus is the HTTP status the Messages API answers an error type
// with (Anthropic's "HTTP errors" documentation), so that a request
// errored in a batch is decided as the same error on the synchronous path
// would be. ok is false for a type llmq does not know.
func errorStatus(errorType string) (status int, ok bool) {
	switch errorType {
	case "invalid_request_error":
		return http.StatusBadRequest, true
	case "authentication_error":
		return http.StatusUnauthorized, true
	case "billing_error":
		return http.StatusPaymentRequired, true
	case "permission_error":
		return http.StatusForbidden, true
	case "not_found_error":
		return http.StatusNotFound, true
	case "request_too_large":
		return http.StatusRequestEntityTooLarge, true
	case "rate_limit_error":
		return http.StatusTooManyRequests, true
	case "api_error":
		return http.StatusInternalServerError, true
	case "timeout_error":
		return http.StatusGatewayTimeout, true
	case "overloaded_error":
		return 529, true // Anthropic's own status, not in net/http
	}
	return 0, false
}

// erroredResult is the failure of an "errored" result, from its error
// body ({"type":"error","error":{"type":...,"message":...}}). An error
// type llmq does not know, or a body it cannot read, is a failure with no
// status: retried, never taken for a refusal.
func erroredResult(body json.RawMessage) *providerbatch.RequestError {
	var e struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Message: string(body)}
	}
	re := &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Code: e.Error.Type, Message: e.Error.Message}
	if status, ok := errorStatus(e.Error.Type); ok {
		re.Kind, re.Status = providerbatch.StatusKind(status), status
	}
	return re
}

// Cancel implements providerbatch.Provider. The batch is "canceling"
// until Anthropic ends it; requests it had not run come back "canceled".
func (b *Batches) Cancel(ctx context.Context, id string) error {
	if _, err := b.client.Messages.Batches.Cancel(ctx, id, sdk.MessageBatchCancelParams{}); err != nil {
		return fmt.Errorf("anthropic: cancelling message batch %s: %w", id, err)
	}
	return nil
}
