package localserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/examples/fakeprovider"
)

// Config sizes the simulated server. Zero fields take the defaults.
type Config struct {
	// KVTokens is the KV cache's capacity in tokens. Default 200,000.
	KVTokens int64
	// MaxModelLen is the longest context (prompt plus max_tokens) the
	// server accepts; longer is a 400. Default KVTokens.
	MaxModelLen int64
	// MaxRunning bounds the requests run at once (vLLM's max_num_seqs).
	// Default 256.
	MaxRunning int
	// DecodeStep is one engine step: a token for every running request.
	// Default 25ms.
	DecodeStep time.Duration
	// PrefillPerToken is what each prompt token adds to the step that
	// prefills it. Default 50µs (20,000 tokens a second).
	PrefillPerToken time.Duration
	// OutputTokens is how many tokens a request generates, at most its
	// max_tokens. Default 200.
	OutputTokens int64
	// Scale divides every time, so tests run fast. Default 1.
	Scale float64
	// Model names the model in the metrics' labels and the answers.
	// Default "local".
	Model string
}

func (c Config) withDefaults() Config {
	c.KVTokens = cmp.Or(c.KVTokens, 200_000)
	c.MaxModelLen = cmp.Or(c.MaxModelLen, c.KVTokens)
	c.MaxRunning = cmp.Or(c.MaxRunning, 256)
	c.DecodeStep = cmp.Or(c.DecodeStep, 25*time.Millisecond)
	c.PrefillPerToken = cmp.Or(c.PrefillPerToken, 50*time.Microsecond)
	c.OutputTokens = cmp.Or(c.OutputTokens, 200)
	c.Scale = cmp.Or(c.Scale, 1)
	c.Model = cmp.Or(c.Model, "local")
	return c
}

// Server is the simulated server; it is an http.Handler. Close stops its
// engine.
type Server struct {
	cfg Config
	mux *http.ServeMux

	mu       sync.Mutex
	capacity int64  // the cache's size now (Degrade)
	waiting  []*seq // first come, first served; preempted requests go first
	running  []*seq // in admission order
	kvUsed   int64
	stats    Stats
	ttft     histogram
	e2e      histogram

	wake   chan struct{} // a request arrived or the cache grew
	closed chan struct{}
	done   chan struct{}
	close  sync.Once
}

// Stats counts what the engine did.
type Stats struct {
	Completed        int64 // requests answered
	Aborted          int64 // requests whose client gave up
	Preemptions      int64 // requests preempted (and recomputed later)
	PromptTokens     int64 // tokens prefilled: prompts, and the recomputed contexts of preempted requests
	GenerationTokens int64 // tokens generated
	Running, Waiting int
	KVUsed, KVTokens int64
}

// seq is one request in the engine.
type seq struct {
	prompt, target, generated int64
	arrived, firstToken       time.Time
	done                      chan struct{} // closed when finished
	gone                      bool          // its client gave up
}

func (q *seq) kv() int64 { return q.prompt + q.generated }

// New starts a server's engine.
func New(cfg Config) *Server {
	cfg = cfg.withDefaults()
	s := &Server{
		cfg: cfg, mux: http.NewServeMux(), capacity: cfg.KVTokens,
		ttft: newHistogram(), e2e: newHistogram(),
		wake: make(chan struct{}, 1), closed: make(chan struct{}), done: make(chan struct{}),
	}
	s.mux.HandleFunc("POST /v1/chat/completions", s.complete)
	s.mux.HandleFunc("GET /metrics", s.metrics)
	go s.engine()
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the engine; requests still in it are answered 503.
func (s *Server) Close() {
	s.close.Do(func() { close(s.closed) })
	<-s.done
}

// Degrade sets the cache's size to fraction of Config.KVTokens (1
// restores it). Requests that no longer fit are preempted at the next step.
func (s *Server) Degrade(fraction float64) {
	s.mu.Lock()
	s.capacity = max(1, int64(fraction*float64(s.cfg.KVTokens)))
	s.mu.Unlock()
	s.signal()
}

// Stats returns the engine's counters now.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Running, st.Waiting, st.KVUsed, st.KVTokens = len(s.running), len(s.waiting), s.kvUsed, s.capacity
	return st
}

func (s *Server) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Server) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / s.cfg.Scale)
}

// engine runs steps while there is work, and sleeps until there is.
func (s *Server) engine() {
	defer close(s.done)
	defer s.abortAll()
	for {
		step, ok := s.admit()
		if !ok {
			select {
			case <-s.wake:
				continue
			case <-s.closed:
				return
			}
		}
		t := time.NewTimer(step)
		select {
		case <-t.C:
		case <-s.closed:
			t.Stop()
			return
		}
		s.generate(time.Now())
	}
}

// admit moves waiting requests into the running batch while the cache
// holds what each has so far, and returns the step's duration: false when
// nothing runs.
func (s *Server) admit() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var prefill int64
	for len(s.waiting) > 0 && len(s.running) < s.cfg.MaxRunning {
		q := s.waiting[0]
		if q.gone {
			s.waiting = s.waiting[1:]
			continue
		}
		if s.kvUsed+q.kv() > s.capacity {
			break // first come, first served: the head waits, and so does everyone behind it
		}
		s.waiting = s.waiting[1:]
		s.running = append(s.running, q)
		s.kvUsed += q.kv()
		prefill += q.kv()
		s.stats.PromptTokens += q.kv()
	}
	if len(s.running) == 0 {
		return 0, false
	}
	return s.scaled(s.cfg.DecodeStep + time.Duration(prefill)*s.cfg.PrefillPerToken), true
}

// generate ends a step at now: every running request gets its next token,
// or, when the cache cannot hold them all, the latest admitted are
// preempted first; finished requests are answered.
func (s *Server) generate(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = slices.DeleteFunc(s.running, func(q *seq) bool {
		if q.gone {
			s.kvUsed -= q.kv()
		}
		return q.gone
	})
	for len(s.running) > 0 && s.kvUsed+int64(len(s.running)) > s.capacity {
		victim := s.running[len(s.running)-1]
		s.running = s.running[:len(s.running)-1]
		s.kvUsed -= victim.kv()
		s.waiting = append([]*seq{victim}, s.waiting...)
		s.stats.Preemptions++
	}
	kept := s.running[:0]
	for _, q := range s.running {
		q.generated++
		s.kvUsed++
		s.stats.GenerationTokens++
		if q.firstToken.IsZero() {
			q.firstToken = now
			s.ttft.observe(now.Sub(q.arrived).Seconds())
		}
		if q.generated < q.target {
			kept = append(kept, q)
			continue
		}
		s.kvUsed -= q.kv()
		s.stats.Completed++
		s.e2e.observe(now.Sub(q.arrived).Seconds())
		close(q.done)
	}
	clear(s.running[len(kept):])
	s.running = kept
}

func (s *Server) abortAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range append(s.running, s.waiting...) {
		if !q.gone {
			q.gone = true
			close(q.done)
		}
	}
	s.running, s.waiting = nil, nil
}

// writeError answers in OpenAI's error shape.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": msg, "type": typ}})
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	var req fakeprovider.ChatRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 8<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "the body is not a chat completions request: "+err.Error())
		return
	}
	var text strings.Builder
	document := ""
	for _, m := range req.Messages {
		text.WriteString(m.Content)
		if m.Role == "user" {
			document = m.Content
		}
	}
	prompt := int64(text.Len()/4 + 1)
	maxTokens := int64(cmp.Or(req.MaxTokens, 800))
	if prompt+maxTokens > s.cfg.MaxModelLen {
		writeError(w, http.StatusBadRequest, "invalid_request_error",
			fmt.Sprintf("this model's maximum context length is %d tokens; the request has %d prompt tokens and max_tokens %d", s.cfg.MaxModelLen, prompt, maxTokens))
		return
	}
	generated, err := s.Generate(r.Context(), prompt, maxTokens)
	switch {
	case r.Context().Err() != nil:
		return // the client gave up
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "server_error", err.Error())
		return
	}
	content, err := json.Marshal(fakeprovider.Extract(document))
	if err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(fakeprovider.ChatResponse{
		ID: "local-" + strconv.FormatInt(time.Now().UnixNano(), 36), Object: "chat.completion", Created: time.Now().Unix(), Model: s.cfg.Model,
		Choices: []fakeprovider.ChatChoice{{Message: fakeprovider.ChatMessage{Role: "assistant", Content: string(content)}, FinishReason: "stop"}},
		Usage:   fakeprovider.Usage{PromptTokens: prompt, CompletionTokens: generated, TotalTokens: prompt + generated},
	})
}

// ErrClosed is returned by Generate once the server is closed.
var ErrClosed = errors.New("localserver: the server is shutting down")

// Generate runs one request of promptTokens through the engine, as the
// HTTP endpoint does, and returns the tokens it generated: at most
// maxTokens, Config.OutputTokens by default. It returns when the request
// is finished, ctx ends (its cache is freed at the next step) or the
// server is closed (ErrClosed). A host that has its own HTTP front (the
// demo's fake provider) uses it as that front's latency.
func (s *Server) Generate(ctx context.Context, promptTokens, maxTokens int64) (int64, error) {
	q := &seq{prompt: max(1, promptTokens), target: max(1, min(maxTokens, s.cfg.OutputTokens)), arrived: time.Now(), done: make(chan struct{})}
	s.mu.Lock()
	s.waiting = append(s.waiting, q)
	s.mu.Unlock()
	s.signal()
	select {
	case <-q.done:
	case <-ctx.Done():
		s.mu.Lock()
		if !q.gone {
			q.gone = true
			s.stats.Aborted++
		}
		s.mu.Unlock()
		s.signal()
		return 0, ctx.Err()
	}
	s.mu.Lock()
	aborted := q.gone
	s.mu.Unlock()
	if aborted {
		return 0, ErrClosed
	}
	return q.target, nil
}
