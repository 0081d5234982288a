package invoice

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	llmqopenai "github.com/llmq/llmq/provider/openai"
	"github.com/llmq/llmq/providerbatch"
)

// The names of an extraction route's candidates (lease.Candidate.Name), as
// attempts record them (jobs.Attempt.Candidate, jobs.Move.Candidate).
const (
	// PrimaryCandidate is the worker's provider (WorkerConfig.ProviderURL,
	// Pool), asked for Model in OpenAI's dialect.
	PrimaryCandidate = "primary"
	// FallbackCandidate is WorkerConfig.Fallback, in Anthropic's dialect.
	FallbackCandidate = "fallback"
)

// Fallback is a second candidate for extractions (WorkerConfig.Fallback):
// a model served through Anthropic's Messages API, under an admission
// pool of its own. With it, an extraction attempt whose primary pool is
// cooling down, or out of budget for longer than the runner's
// Admission.MaxWait, is served by the fallback, and one whose primary call
// fails with a 429, a 5xx, a timeout or an unreachable provider moves to
// the fallback at once, inside the same attempt (lease.Route).
type Fallback struct {
	// ProviderURL is the Anthropic-compatible server's root URL, without
	// /v1 (the Anthropic SDK adds it); a trailing /v1 is dropped. Required.
	ProviderURL string
	// APIKey is sent as x-api-key.
	APIKey string
	// Pool is the fallback's admission pool; it must differ from the
	// primary's (a pool serves one model). Required.
	Pool string
	// Model is the model the fallback is asked for. Required.
	Model string
	// Limits of the pool (RPM, TPM, MaxInFlight), set on start-up as
	// WorkerConfig.Limits is. Zero RPM leaves the pool as it is (it must
	// then exist).
	Limits admission.Pool
}

// messagesCall is the extraction's provider call in Anthropic's dialect:
// the same request (system prompt, the document fenced as data, the output
// budget within the permit) and the same checks of the answer
// (checkAnswer) as extractCall's, so the fallback's answers are validated,
// reviewed and refused as invalid exactly as the primary's.
func (s *Service) messagesCall() *providerbatch.Call[Payload, Result, sdk.MessageNewParams, *sdk.Message] {
	return providerbatch.NewCall(ExtractKind, llmqanthropic.Messages{}, s.buildMessages, s.parseMessages)
}

// buildMessages is buildExtraction in Anthropic's dialect. There is no
// JSON response format: the system prompt asks for one JSON object, and
// checkAnswer refuses anything else as invalid output. (The SDK's
// MessageNewParams here has no temperature field; the model's default is
// used.)
func (s *Service) buildMessages(ctx context.Context, job *jobs.Job, p Payload) (sdk.MessageNewParams, error) {
	in, err := s.extractionInput(ctx, job, p)
	if err != nil {
		return sdk.MessageNewParams{}, err
	}
	return sdk.MessageNewParams{
		Model:     in.model,
		System:    []sdk.TextBlockParam{{Text: systemPrompt}},
		Messages:  []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(in.text))},
		MaxTokens: int64(in.maxTokens),
	}, nil
}

// parseMessages is parseExtraction in Anthropic's dialect: the answer's
// text blocks, checked by checkAnswer.
func (s *Service) parseMessages(ctx context.Context, job *jobs.Job, p Payload, answer *sdk.Message) (Result, error) {
	var content strings.Builder
	for _, block := range answer.Content {
		if block.Type == "text" {
			content.WriteString(block.Text)
		}
	}
	if content.Len() == 0 {
		return Result{}, jobs.InvalidOutput(errors.New("provider answer has no text"), nil)
	}
	return s.checkAnswer(ctx, job, p, content.String())
}

// routedExtractor is the handler of Kind under a route: one handler for
// both candidates, calling the one lease.CandidateOf names in its dialect
// through its client, with its model.
type routedExtractor struct {
	openai, anthropic lease.Handler
}

func (s *Service) newRoutedExtractor() *routedExtractor {
	openai := s.extractCall().Handle(func(ctx context.Context, req oai.ChatCompletionNewParams) (*oai.ChatCompletion, error) {
		cand, _ := lease.CandidateOf(ctx)
		client, _ := cand.Adapter.(*llmqopenai.Client)
		return llmqopenai.Call(ctx, func(ctx context.Context) (*oai.ChatCompletion, error) {
			return client.Chat.Completions.New(ctx, req)
		})
	})
	anthropic := s.messagesCall().Handle(func(ctx context.Context, req sdk.MessageNewParams) (*sdk.Message, error) {
		cand, _ := lease.CandidateOf(ctx)
		client, _ := cand.Adapter.(*llmqanthropic.Client)
		return llmqanthropic.Call(ctx, func(ctx context.Context) (*sdk.Message, error) {
			return client.Messages.New(ctx, req)
		})
	})
	return &routedExtractor{openai: openai.Handler, anthropic: anthropic.Handler}
}

func (h *routedExtractor) Work(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
	cand, ok := lease.CandidateOf(ctx)
	if !ok {
		return nil, lease.NotSent(errors.New("invoice: an extraction attempt without its route candidate"))
	}
	switch cand.Adapter.(type) {
	case *llmqopenai.Client:
		return h.openai.Work(ctx, job)
	case *llmqanthropic.Client:
		return h.anthropic.Work(ctx, job)
	}
	return nil, jobs.Permanent(errors.New("invoice: route candidate " + cand.Name + " has an adapter of unknown type " + cand.Adapter.Provider()))
}

// checkFallback refuses a Fallback that cannot work, before anything is
// set up (a pool's limits included).
func (cfg WorkerConfig) checkFallback() error {
	fb := cfg.Fallback
	switch {
	case fb == nil:
		return nil
	case fb.ProviderURL == "":
		return errors.New("invoice: WorkerConfig.Fallback.ProviderURL is required")
	case fb.Pool == "" || fb.Model == "":
		return errors.New("invoice: WorkerConfig.Fallback.Pool and Model are required")
	case fb.Pool == cfg.Pool:
		return errors.New("invoice: WorkerConfig.Fallback.Pool must differ from Pool: a pool serves one model")
	}
	return nil
}

// extractionRoute is the route of Kind with a fallback: the primary pool
// and Model through an openai-go client, then the fallback through an
// anthropic-sdk-go client, both under llmq's adapters (retries off, every
// response reported to admission, usage recorded).
func extractionRoute(cfg WorkerConfig, httpClient *http.Client) (lease.Route, error) {
	fb := cfg.Fallback
	primary, err := llmqopenai.NewClient(llmqopenai.Config{}, option.WithBaseURL(cfg.ProviderURL),
		option.WithAPIKey(cfg.APIKey), option.WithHTTPClient(httpClient))
	if err != nil {
		return lease.Route{}, err
	}
	root := strings.TrimSuffix(strings.TrimSuffix(fb.ProviderURL, "/"), "/v1")
	fallback, err := llmqanthropic.NewClient(llmqanthropic.Config{}, aopt.WithBaseURL(root),
		aopt.WithAPIKey(fb.APIKey), aopt.WithHTTPClient(httpClient))
	if err != nil {
		return lease.Route{}, err
	}
	return lease.Route{Candidates: []lease.Candidate{
		{Name: PrimaryCandidate, Pool: cfg.Pool, Model: Model, Adapter: primary},
		{Name: FallbackCandidate, Pool: fb.Pool, Model: fb.Model, Adapter: fallback},
	}}, nil
}
