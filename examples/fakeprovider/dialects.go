package fakeprovider

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxRequestBody bounds a request's body in either API.
const maxRequestBody = 1 << 20

// openAI is the chat-completions API: POST /v1/chat/completions.
var openAI = dialect{
	name:   "openai",
	apiKey: bearer,
	decode: func(raw []byte) (request, error) {
		var req request
		var body ChatRequest
		if err := json.Unmarshal(raw, &body); err != nil {
			return req, fmt.Errorf("body: %w", err)
		}
		if len(body.Messages) == 0 {
			return req, errors.New("messages: required")
		}
		req.model, req.maxTokens = body.Model, body.MaxTokens
		var doc strings.Builder
		for _, m := range body.Messages {
			req.promptChars += len(m.Content)
			if m.Role == "user" {
				doc.WriteString(m.Content)
			}
		}
		req.document = doc.String()
		return req, nil
	},
	rateHeaders: func(h http.Header, l levels, _ time.Time) {
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(l.rpm))
		h.Set("x-ratelimit-limit-tokens", strconv.Itoa(l.tpm))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(max(0, int(l.requests))))
		h.Set("x-ratelimit-remaining-tokens", strconv.Itoa(max(0, int(l.tokens))))
		h.Set("x-ratelimit-reset-requests", refill(1-l.requests, float64(l.rpm)/60).String())
		h.Set("x-ratelimit-reset-tokens", refill(1-l.tokens, float64(l.tpm)/60).String())
	},
	overloaded:        http.StatusServiceUnavailable,
	overloadedMessage: "The engine is currently overloaded, please try again later",
	errorBody: func(kind errorKind, msg string) any {
		typ := [...]string{errInvalidRequest: "invalid_request_error", errRateLimit: "rate_limit_exceeded", errServer: "server_error", errNotFound: "invalid_request_error", errOverloaded: "service_unavailable_error"}[kind]
		body := openAIErrorBody(typ, msg)
		if kind == errOverloaded {
			code := "server_is_overloaded"
			body.Error.Code = &code
		}
		return body
	},
	answerBody: func(id string, created time.Time, model, content string, usage Usage) any {
		return ChatResponse{
			ID: "chatcmpl-" + id, Object: "chat.completion", Created: created.Unix(), Model: model,
			Choices: []ChatChoice{{Message: ChatMessage{Role: "assistant", Content: content}, FinishReason: "stop"}},
			Usage:   usage,
		}
	},
}

// openAIError is OpenAI's error body. Param is always null here, and Code
// too but for an overloaded model's "server_is_overloaded".
type openAIError struct {
	Error openAIErrorDetail `json:"error"`
}

type openAIErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func openAIErrorBody(typ, msg string) openAIError {
	return openAIError{Error: openAIErrorDetail{Message: msg, Type: typ}}
}

// bearer is the request's bearer token, "" without one.
func bearer(h http.Header) string {
	return strings.TrimPrefix(h.Get("Authorization"), "Bearer ")
}

// MessagesRequest is the part of an Anthropic Messages API request the fake
// reads. System and each message's content are a string or a list of
// content blocks, of which the text blocks are read.
type MessagesRequest struct {
	Model     string            `json:"model"`
	MaxTokens int               `json:"max_tokens"`
	System    json.RawMessage   `json:"system,omitempty"`
	Messages  []MessagesMessage `json:"messages"`
}

// MessagesMessage is one message of a Messages API request.
type MessagesMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// MessagesResponse is an Anthropic Messages API answer.
type MessagesResponse struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   string         `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        MessagesUsage  `json:"usage"`
}

// ContentBlock is a text content block.
type ContentBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// MessagesUsage is the usage the Messages API reports.
type MessagesUsage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// anthropic is the Messages API: POST /v1/messages.
var anthropic = dialect{
	name: "anthropic",
	// The SDK sends x-api-key, or a bearer token when given an auth token.
	apiKey: func(h http.Header) string { return cmp.Or(h.Get("X-Api-Key"), bearer(h)) },
	decode: func(raw []byte) (request, error) {
		var req request
		var body MessagesRequest
		if err := json.Unmarshal(raw, &body); err != nil {
			return req, fmt.Errorf("body: %w", err)
		}
		switch {
		case len(body.Messages) == 0:
			return req, errors.New("messages: required")
		case body.MaxTokens <= 0:
			return req, errors.New("max_tokens: required")
		}
		req.model, req.maxTokens = body.Model, body.MaxTokens
		system, err := blocksText(body.System)
		if err != nil {
			return req, fmt.Errorf("system: %w", err)
		}
		req.promptChars = len(system)
		var doc strings.Builder
		for i, m := range body.Messages {
			text, err := blocksText(m.Content)
			if err != nil {
				return req, fmt.Errorf("messages.%d.content: %w", i, err)
			}
			req.promptChars += len(text)
			if m.Role == "user" {
				doc.WriteString(text)
			}
		}
		req.document = doc.String()
		return req, nil
	},
	rateHeaders: func(h http.Header, l levels, now time.Time) {
		h.Set("anthropic-ratelimit-requests-limit", strconv.Itoa(l.rpm))
		h.Set("anthropic-ratelimit-tokens-limit", strconv.Itoa(l.tpm))
		h.Set("anthropic-ratelimit-requests-remaining", strconv.Itoa(max(0, int(l.requests))))
		h.Set("anthropic-ratelimit-tokens-remaining", strconv.Itoa(max(0, int(l.tokens))))
		h.Set("anthropic-ratelimit-requests-reset", now.Add(refill(1-l.requests, float64(l.rpm)/60)).UTC().Format(time.RFC3339Nano))
		h.Set("anthropic-ratelimit-tokens-reset", now.Add(refill(1-l.tokens, float64(l.tpm)/60)).UTC().Format(time.RFC3339Nano))
	},
	// 529 is Anthropic's own status for an API without capacity.
	overloaded:        529,
	overloadedMessage: "Overloaded",
	errorBody: func(kind errorKind, msg string) any {
		typ := [...]string{errInvalidRequest: "invalid_request_error", errRateLimit: "rate_limit_error", errServer: "api_error", errNotFound: "not_found_error", errOverloaded: "overloaded_error"}[kind]
		return anthropicError{Type: "error", Error: anthropicErrorDetail{Type: typ, Message: msg}}
	},
	answerBody: func(id string, _ time.Time, model, content string, usage Usage) any {
		return MessagesResponse{
			ID: "msg_" + id, Type: "message", Role: "assistant", Model: model,
			Content: []ContentBlock{{Type: "text", Text: content}}, StopReason: "end_turn",
			Usage: MessagesUsage{InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens},
		}
	},
}

// anthropicError is Anthropic's error body.
type anthropicError struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// blocksText reads a Messages API content value: a string, or a list of
// blocks whose text blocks are joined. Absent is empty.
func blocksText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var blocks []ContentBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", errors.New("want a string or a list of content blocks")
	}
	var b strings.Builder
	for _, block := range blocks {
		if block.Type == "text" {
			b.WriteString(block.Text)
		}
	}
	return b.String(), nil
}

// levels are one quota's limits and its buckets' levels, for the
// rate-limit headers.
type levels struct {
	rpm, tpm         int
	requests, tokens float64
}

// levels returns q's limits and its buckets' levels at now.
func (s *Server) levels(q *quota, now time.Time) levels {
	s.mu.Lock()
	defer s.mu.Unlock()
	return levels{rpm: q.rpm, tpm: q.tpm, requests: q.requests.TokensAt(now), tokens: q.tokens.TokensAt(now)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
