package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/provider/internal/adapt"
)

// ErrInvalidConfig reports a Config that cannot work.
var ErrInvalidConfig = errors.New("provider/anthropic: invalid config")

// Config configures the adapter. The zero value is ready: responses inside
// an admitted attempt reach admission through lease.Responded.
type Config struct {
	// Limiter, with Pool, receives the responses of calls made outside an
	// admitted attempt (a handler without lease.Admission, a call outside
	// any handler), through admission.Observe. Optional.
	Limiter admission.Limiter
	// Pool is the admission pool of the calls; required with Limiter.
	Pool string
}

var dialect = adapt.Dialect{
	Name: "anthropic",
	APIError: func(err error) (int, http.Header, bool) {
		var apiErr *sdk.Error
		if !errors.As(err, &apiErr) {
			return 0, nil, false
		}
		var h http.Header
		if apiErr.Response != nil {
			h = apiErr.Response.Header
		}
		return apiErr.StatusCode, h, true
	},
	Usage: Usage,
	// Anthropic gives a prompt past the window no code of its own: a 400
	// invalid_request_error whose message says the prompt is too long.
	ContextWindow: func(err error) bool {
		var apiErr *sdk.Error
		return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusBadRequest &&
			strings.Contains(strings.ToLower(apiErr.Message), "prompt is too long")
	},
}

// Client is an anthropic-sdk-go client built with Options, to be a route
// candidate's adapter (lease.Candidate.Adapter): a handler serving several
// candidates finds it with lease.CandidateOf and calls it inside Call,
// with the candidate's model.
type Client struct {
	sdk.Client
}

// NewClient returns a client built with opts (the host's: API key, base
// URL, HTTP client) followed by Options(cfg).
func NewClient(cfg Config, opts ...option.RequestOption) (*Client, error) {
	llmq, err := Options(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{Client: sdk.NewClient(append(slices.Clone(opts), llmq...)...)}, nil
}

// Provider names the API: "anthropic".
func (*Client) Provider() string { return "anthropic" }

// Options returns the client options that put an anthropic-sdk-go client under
// llmq: its retries off (option.WithMaxRetries(0): llmq owns retries) and
// the middleware that reports every response to admission and records
// the usage a JSON answer reports. Give them to anthropic.NewClient, after
// any option of the host's own that sets retries.
func Options(cfg Config) ([]option.RequestOption, error) {
	if cfg.Limiter != nil && cfg.Pool == "" {
		return nil, errors.Join(ErrInvalidConfig, errors.New("Config.Pool is required with Config.Limiter"))
	}
	return []option.RequestOption{
		option.WithMaxRetries(0),
		option.WithMiddleware((&adapt.Middleware{Dialect: dialect, Observer: adapt.Observer{Limiter: cfg.Limiter, Pool: cfg.Pool}}).Handle),
	}, nil
}

// Call runs fn, one provider call made with a client built with Options
// and the context fn is given, and returns its error classified for the
// lease runner (see the package documentation).
func Call[T any](ctx context.Context, fn func(ctx context.Context) (T, error)) (T, error) {
	return adapt.Call(ctx, dialect, fn)
}

// Usage reads the usage an Anthropic answer's JSON body reports: its
// input tokens (input_tokens plus the cache's cache_creation_input_tokens
// and cache_read_input_tokens: every prompt token the call processed) and
// output_tokens. ok is false when the body reports none.
func Usage(body []byte) (u jobs.Usage, ok bool) {
	var answer struct {
		Usage *struct {
			InputTokens              int64 `json:"input_tokens"`
			CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
			CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
			OutputTokens             int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || answer.Usage == nil {
		return jobs.Usage{}, false
	}
	return jobs.Usage{
		InputTokens:  adapt.Tokens(answer.Usage.InputTokens, answer.Usage.CacheCreationInputTokens, answer.Usage.CacheReadInputTokens),
		OutputTokens: adapt.Tokens(answer.Usage.OutputTokens),
	}, true
}
