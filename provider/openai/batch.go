package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/providerbatch"
)

// Chat is the codec of the chat completions API, for providerbatch.NewCall:
// a request is an oai.ChatCompletionNewParams, an answer an
// *oai.ChatCompletion, in a batch as on the synchronous path.
type Chat struct{}

// Provider implements providerbatch.Codec.
func (Chat) Provider() string { return providerName }

// Model implements providerbatch.Codec.
func (Chat) Model(req oai.ChatCompletionNewParams) string { return req.Model }

// Encode implements providerbatch.Codec.
func (Chat) Encode(req oai.ChatCompletionNewParams) (json.RawMessage, error) {
	return json.Marshal(req)
}

// Decode implements providerbatch.Codec. An answer without choices is not
// a chat completion.
func (Chat) Decode(body json.RawMessage) (*oai.ChatCompletion, error) {
	var c oai.ChatCompletion
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, err
	}
	if len(c.Choices) == 0 {
		return nil, errors.New("the chat completion has no choices")
	}
	return &c, nil
}

// Usage implements providerbatch.Codec.
func (Chat) Usage(resp *oai.ChatCompletion) jobs.Usage {
	return jobs.Usage{InputTokens: resp.Usage.PromptTokens, OutputTokens: resp.Usage.CompletionTokens}
}

const (
	providerName = "openai"
	// metadataKey tags each batch with llmq's submission id, so that a
	// submitter taking over finds a batch its predecessor created but did
	// not record.
	metadataKey = "llmq_submission"
	// OpenAI's limits on one batch's input file.
	maxBatchRequests = 50_000
	maxBatchBytes    = 200 << 20
)

// BatchesConfig configures Batches.
type BatchesConfig struct {
	// EnqueuedTokens is the organisation's enqueued-token limit for the
	// models the pool's batches use (OpenAI's "batch queue limit", which
	// depends on the model and the usage tier). Zero: no limit is
	// enforced by llmq, and a batch past it fails at the provider.
	EnqueuedTokens int64
}

// Batches is OpenAI's Batch API (Files and Batches) as a
// providerbatch.Provider: a batch is a JSONL input file of chat
// completion requests, uploaded with purpose "batch", and a batch on it
// with metadata naming llmq's submission.
type Batches struct {
	client oai.Client
	cfg    BatchesConfig
}

// NewBatches returns the Batch API of client. Build client with Options,
// as for synchronous calls: its retries off, llmq owns them.
func NewBatches(client oai.Client, cfg BatchesConfig) (*Batches, error) {
	if cfg.EnqueuedTokens < 0 {
		return nil, errors.Join(ErrInvalidConfig, errors.New("BatchesConfig.EnqueuedTokens must not be negative"))
	}
	return &Batches{client: client, cfg: cfg}, nil
}

// Name implements providerbatch.Provider.
func (b *Batches) Name() string { return providerName }

// Limits implements providerbatch.Provider: 50,000 requests and 200 MB an
// input file, and BatchesConfig.EnqueuedTokens.
func (b *Batches) Limits() providerbatch.Limits {
	return providerbatch.Limits{MaxRequests: maxBatchRequests, MaxBytes: maxBatchBytes, MaxEnqueuedTokens: b.cfg.EnqueuedTokens}
}

// inputLine is one line of a batch's input file.
type inputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// Create implements providerbatch.Provider: it uploads the input file and
// creates the batch on it.
func (b *Batches) Create(ctx context.Context, batch providerbatch.Batch) (string, error) {
	var file bytes.Buffer
	enc := json.NewEncoder(&file)
	for _, r := range batch.Requests {
		if err := enc.Encode(inputLine{CustomID: r.CustomID, Method: "POST", URL: string(oai.BatchNewParamsEndpointV1ChatCompletions), Body: r.Body}); err != nil {
			return "", fmt.Errorf("openai: encoding request %s: %w", r.CustomID, err)
		}
	}
	uploaded, err := b.client.Files.New(ctx, oai.FileNewParams{
		File:    oai.File(&file, "llmq-"+batch.Submission.String()+".jsonl", "application/jsonl"),
		Purpose: oai.FilePurposeBatch,
	})
	if err != nil {
		return "", fmt.Errorf("openai: uploading the input file: %w", err)
	}
	created, err := b.client.Batches.New(ctx, oai.BatchNewParams{
		InputFileID:      uploaded.ID,
		Endpoint:         oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h,
		Metadata:         shared.Metadata{metadataKey: batch.Submission.String()},
	})
	if err != nil {
		return "", fmt.Errorf("openai: creating the batch on file %s: %w", uploaded.ID, err)
	}
	return created.ID, nil
}

// Find implements providerbatch.Provider: it lists batches newest first
// down to since and returns those tagged with submission, oldest first.
func (b *Batches) Find(ctx context.Context, lost providerbatch.Lost) ([]string, error) {
	submission, since := lost.Submission, lost.Since
	pager := b.client.Batches.ListAutoPaging(ctx, oai.BatchListParams{Limit: oai.Int(100)})
	var found []string
	for pager.Next() {
		batch := pager.Current()
		if time.Unix(batch.CreatedAt, 0).Before(since) {
			break
		}
		if batch.Metadata[metadataKey] == submission.String() {
			found = append(found, batch.ID)
		}
	}
	if err := pager.Err(); err != nil {
		return nil, fmt.Errorf("openai: listing batches: %w", err)
	}
	for i, j := 0, len(found)-1; i < j; i, j = i+1, j-1 {
		found[i], found[j] = found[j], found[i]
	}
	return found, nil
}

// Status implements providerbatch.Provider.
func (b *Batches) Status(ctx context.Context, id string) (providerbatch.Status, error) {
	batch, err := b.client.Batches.Get(ctx, id)
	if err != nil {
		return providerbatch.Status{}, fmt.Errorf("openai: reading batch %s: %w", id, err)
	}
	return statusOf(batch), nil
}

func statusOf(batch *oai.Batch) providerbatch.Status {
	s := providerbatch.Status{State: string(batch.Status)}
	switch batch.Status {
	case oai.BatchStatusCompleted, oai.BatchStatusExpired, oai.BatchStatusCancelled:
		s.Ended = true
	case oai.BatchStatusFailed:
		s.Ended, s.Failed = true, true
		var reasons []string
		for _, e := range batch.Errors.Data {
			reasons = append(reasons, fmt.Sprintf("%s: %s", e.Code, e.Message))
		}
		s.Reason = strings.Join(reasons, "; ")
	}
	return s
}

// Results implements providerbatch.Provider: the output file's lines, then
// the error file's.
func (b *Batches) Results(ctx context.Context, id string, fn func(providerbatch.Result) error) error {
	batch, err := b.client.Batches.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("openai: reading batch %s: %w", id, err)
	}
	for _, file := range []string{batch.OutputFileID, batch.ErrorFileID} {
		if file == "" {
			continue
		}
		if err := b.readFile(ctx, file, fn); err != nil {
			return err
		}
	}
	return nil
}

func (b *Batches) readFile(ctx context.Context, file string, fn func(providerbatch.Result) error) error {
	resp, err := b.client.Files.Content(ctx, file)
	if err != nil {
		return fmt.Errorf("openai: reading file %s: %w", file, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if err := providerbatch.ReadResults(resp.Body, ParseResultLine, fn); err != nil {
		return fmt.Errorf("openai: reading file %s: %w", file, err)
	}
	return nil
}

// resultLine is a line of a batch's output or error file.
type resultLine struct {
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// ParseResultLine reads one line of a batch's output or error file. A
// line it cannot read comes back with Problem set.
func ParseResultLine(line []byte) providerbatch.Result {
	var l resultLine
	if err := json.Unmarshal(line, &l); err != nil {
		return providerbatch.Result{Problem: fmt.Sprintf("not a JSON result line: %v", err)}
	}
	res := providerbatch.Result{CustomID: l.CustomID}
	switch {
	case l.CustomID == "":
		res.Problem = "the line has no custom_id"
	case l.Response != nil && l.Response.StatusCode == http.StatusOK:
		res.Body = l.Response.Body
		if len(bytes.TrimSpace(res.Body)) == 0 || bytes.Equal(bytes.TrimSpace(res.Body), []byte("null")) {
			res.Body, res.Problem = nil, "the line answers 200 without a body"
		}
	case l.Response != nil && l.Response.StatusCode != 0:
		res.Err = &providerbatch.RequestError{Kind: providerbatch.StatusKind(l.Response.StatusCode), Status: l.Response.StatusCode}
		res.Err.Code, res.Err.Message = apiError(l.Response.Body)
	case l.Error != nil:
		res.Err = &providerbatch.RequestError{Kind: providerbatch.RequestFailed, Code: l.Error.Code, Message: l.Error.Message}
		switch l.Error.Code {
		case "batch_expired":
			res.Err.Kind = providerbatch.RequestExpired
		case "batch_cancelled":
			res.Err.Kind = providerbatch.RequestCancelled
		}
	default:
		res.Problem = "the line has neither a response nor an error"
	}
	return res
}

// apiError reads an error body's code (or type) and message.
func apiError(body json.RawMessage) (code, message string) {
	var e struct {
		Error struct {
			Code    *string `json:"code"`
			Type    string  `json:"type"`
			Message string  `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return "", string(body)
	}
	code = e.Error.Type
	if e.Error.Code != nil && *e.Error.Code != "" {
		code = *e.Error.Code
	}
	return code, e.Error.Message
}

// Cancel implements providerbatch.Provider.
func (b *Batches) Cancel(ctx context.Context, id string) error {
	if _, err := b.client.Batches.Cancel(ctx, id); err != nil {
		return fmt.Errorf("openai: cancelling batch %s: %w", id, err)
	}
	return nil
}
