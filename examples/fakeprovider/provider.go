package fakeprovider

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Config configures a Server. The zero value is a provider with a 15s mean
// latency, 600 RPM, 1M TPM, no random faults, and batches that take 10
// minutes within the providers' documented limits.
type Config struct {
	// MeanLatency is the provider's mean answer time before scaling.
	// Default 15s.
	MeanLatency time.Duration
	// Scale divides MeanLatency (100 turns 15s into 150ms). Default 1.
	Scale float64
	// RPM and TPM are the enforced limits. Defaults 600 and 1,000,000.
	RPM int
	TPM int
	// Models gives the models named here (a request's "model") quotas of
	// their own, enforced with their own buckets as RPM and TPM are; a
	// request for any other model takes from RPM and TPM.
	Models map[string]ModelConfig
	// TimeoutRate, MalformedRate and WrongRate are the probabilities of a
	// hung call, a malformed answer and a plausible but wrong extraction.
	TimeoutRate, MalformedRate, WrongRate float64
	// Seed seeds the random faults and latencies. Default 1.
	Seed uint64
	// OnCall, when set, is called once per request, after its answer was
	// written and flushed to the client (for a hung call: after the client
	// gave up), and once per request answered inside a batch, as
	// OnBatchRequest is. Tests use it as the provider's call log and to act at the
	// moment a client has its answer but has not yet used it. It runs on
	// the request's goroutine and must be safe for concurrent use.
	OnCall func(Call)
	// Latency, when set, takes the place of the exponential latency of an
	// answer: it is called with the call's prompt and max tokens and
	// returns when the answer is ready (the demo's -provider local waits
	// for a simulated local server's engine here). An error answers 500.
	// Batch requests never wait on it.
	Latency func(ctx context.Context, promptTokens, maxTokens int64) error

	// BatchDelay is how long a batch takes to complete, before scaling:
	// like MeanLatency it is divided by Scale. Default 10 minutes.
	BatchDelay time.Duration
	// OpenAIBatchMaxFileBytes and OpenAIBatchMaxRequests bound one
	// OpenAI batch's input file. Defaults 200 MiB and 50,000 requests.
	OpenAIBatchMaxFileBytes int64
	OpenAIBatchMaxRequests  int
	// OpenAIEnqueuedTokenLimit bounds, per model, the estimated input
	// tokens of the OpenAI batches not yet ended; a batch that would pass
	// it fails with "token_limit_exceeded". 0: no limit.
	OpenAIEnqueuedTokenLimit int64
	// AnthropicBatchMaxRequests and AnthropicBatchMaxBytes bound one
	// Message Batch. Defaults 100,000 requests and 256 MiB.
	AnthropicBatchMaxRequests int
	AnthropicBatchMaxBytes    int64
	// OnBatchCreate, when set, is called once per batch created (a batch
	// failed for the enqueued-token limit included), after the create's
	// answer was written and flushed: the moment to kill a client that
	// has created a batch but not recorded it.
	OnBatchCreate func(BatchCreated)
	// OnBatchRequest, when set, is called once per request answered inside
	// a batch (not for those expired or cancelled), after the server's
	// lock was released, on the goroutine whose read or control made the
	// batch complete.
	OnBatchRequest func(BatchRequest)
}

// ModelConfig is one model's quotas (Config.Models). A zero RPM or TPM is
// Config's.
type ModelConfig struct {
	RPM int
	TPM int
}

// Call describes one request the server handled, for Config.OnCall.
type Call struct {
	Start, End time.Time
	// API is the API called: "openai" (chat completions) or "anthropic"
	// (messages), or "openai-batch" and "anthropic-batch" for a request
	// answered inside a batch (Start and End are then both the moment
	// the fake answered it).
	API string
	// APIKey is the request's key: OpenAI's bearer token or Anthropic's
	// x-api-key or bearer token ("" without one). For a batch request,
	// the key that created the batch.
	APIKey string
	// Model is the model the request asked for ("" when unreadable).
	Model string
	// Document is the user messages' text.
	Document string
	// Status is the HTTP status answered; 0 for a hung call the client
	// gave up on.
	Status int
	// Fault is what the server did to the call: "" (a correct answer),
	// "rate-limited", "overloaded" (OutageModel), "timeout", "malformed",
	// "wrong-iban", "bad-total", "server-error" or "bad-request".
	Fault string
	// PromptTokens and CompletionTokens are the usage reported (zero
	// unless answered with 200).
	PromptTokens, CompletionTokens int64
}

// Stats counts what the server did. The counters up to ServerErrors count
// synchronous calls only; the Batch ones count the batch APIs.
type Stats struct {
	Calls       int64 `json:"calls"`
	Answered    int64 `json:"answered"`
	RateLimited int64 `json:"rate_limited"`
	Timeouts    int64 `json:"timeouts"`
	Malformed   int64 `json:"malformed"`
	Wrong       int64 `json:"wrong"`
	BadRequests int64 `json:"bad_requests"`
	// ServerErrors counts calls answered 500 (FailNext).
	ServerErrors int64 `json:"server_errors"`
	// Overloaded counts calls refused for their model's outage
	// (OutageModel): 503 in OpenAI's API, 529 in Anthropic's.
	Overloaded int64 `json:"overloaded"`

	// BatchesCreated counts batches created, in either API.
	BatchesCreated int64 `json:"batches_created"`
	// BatchesRefused counts batch creates refused with 400, and OpenAI
	// batches created but failed for the enqueued-token limit.
	BatchesRefused int64 `json:"batches_refused"`
	// BatchRequestsAnswered counts requests inside batches answered 200
	// (malformed and wrong answers included); BatchRequestsErrored those
	// answered 4xx or 5xx; BatchRequestsExpired and
	// BatchRequestsCancelled those never answered.
	BatchRequestsAnswered  int64 `json:"batch_requests_answered"`
	BatchRequestsErrored   int64 `json:"batch_requests_errored"`
	BatchRequestsExpired   int64 `json:"batch_requests_expired"`
	BatchRequestsCancelled int64 `json:"batch_requests_cancelled"`
}

// Server is the fake provider; it is an http.Handler.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	quota  *quota            // the server-wide buckets
	models map[string]*quota // Config.Models' buckets

	mu         sync.Mutex
	faults     map[string]modelFaults // per model: StormModel, OutageModel
	stormUntil time.Time
	stormNext  time.Duration // a storm that begins at the next call (StormFromNextCall)
	rnd        *rand.Rand
	calls      map[[32]byte]int // calls per document, for the "-once" faults
	hangNext   int              // calls still to hang (HangNext)
	malformNxt int              // calls still to answer malformed (MalformNext)
	failNext   int              // calls still to answer 500 (FailNext)

	calls64, answered, limited, timeouts, malformed, wrong, bad, serverErrors, overloaded atomic.Int64

	batches *batchStore
}

// New returns a server for cfg.
func New(cfg Config) *Server {
	if cfg.MeanLatency <= 0 {
		cfg.MeanLatency = 15 * time.Second
	}
	if cfg.Scale <= 0 {
		cfg.Scale = 1
	}
	if cfg.RPM <= 0 {
		cfg.RPM = 600
	}
	if cfg.TPM <= 0 {
		cfg.TPM = 1_000_000
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	cfg = batchDefaults(cfg)
	s := &Server{
		cfg:     cfg,
		mux:     http.NewServeMux(),
		quota:   newQuota(cfg.RPM, cfg.TPM),
		models:  make(map[string]*quota, len(cfg.Models)),
		faults:  map[string]modelFaults{},
		rnd:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), //nolint:gosec // a fake's faults, not secrets
		calls:   map[[32]byte]int{},
		batches: newBatchStore(),
	}
	for name, m := range cfg.Models {
		s.models[name] = newQuota(cmpOr(m.RPM, cfg.RPM), cmpOr(m.TPM, cfg.TPM))
	}
	s.mux.HandleFunc("POST /v1/chat/completions", s.complete)
	s.mux.HandleFunc("POST /v1/messages", s.messages)
	s.routeBatches()
	return s
}

// SampleInvoice is an invoice in the layout the fake model reads, which it
// answers with a correct extraction: the document of tests that need one
// call to succeed.
const SampleInvoice = `INVOICE
Supplier: Nordwind Papier GmbH
Invoice number: NW-1
Currency: EUR
IBAN: DE89370400440532013000
- Copy paper A4 | 2 x 4.50 = 9.00
Subtotal: 9.00
Tax: 1.71
Total: 10.71
`

// Storm makes the provider refuse every call for d with 429 and a
// Retry-After of what is left of d, as a provider under load does.
func (s *Server) Storm(d time.Duration) {
	s.mu.Lock()
	s.stormUntil = time.Now().Add(d)
	s.mu.Unlock()
}

// StormFromNextCall is Storm beginning at the next call rather than now, so
// that a test's storm is met by its first call however long the caller takes
// to get there.
func (s *Server) StormFromNextCall(d time.Duration) {
	s.mu.Lock()
	s.stormNext = d
	s.mu.Unlock()
}

// StormModel is Storm for model's calls only: for d they are refused with
// 429 and a Retry-After of what is left of d, whatever their quota has
// left, while other models' calls are served. Heal ends it.
func (s *Server) StormModel(model string, d time.Duration) {
	s.setFault(model, func(f *modelFaults) { f.stormUntil = time.Now().Add(d) })
}

// OutageModel makes model unavailable for d, as a provider short of
// capacity for it is: its calls are refused, before they take from any
// quota, with the API's overloaded answer (OpenAI: 503 and
// "service_unavailable_error"; Anthropic: 529 and "overloaded_error"),
// without Retry-After, while other models' calls are served. Heal ends it.
func (s *Server) OutageModel(model string, d time.Duration) {
	s.setFault(model, func(f *modelFaults) { f.outageUntil = time.Now().Add(d) })
}

// setFault changes model's run-time faults.
func (s *Server) setFault(model string, change func(*modelFaults)) {
	s.mu.Lock()
	f := s.faults[model]
	change(&f)
	s.faults[model] = f
	s.mu.Unlock()
}

// Heal ends model's StormModel and OutageModel now. The server-wide Storm
// is not model's: Storm(0) ends it.
func (s *Server) Heal(model string) {
	s.mu.Lock()
	delete(s.faults, model)
	s.mu.Unlock()
}

// modelFaults are one model's run-time faults: until when it storms and
// is out.
type modelFaults struct{ stormUntil, outageUntil time.Time }

// quota is one set of RPM and TPM buckets: the server's, or a model's.
type quota struct {
	rpm, tpm         int
	requests, tokens *rate.Limiter
}

func newQuota(rpm, tpm int) *quota {
	return &quota{
		rpm: rpm, tpm: tpm,
		requests: rate.NewLimiter(rate.Limit(float64(rpm)/60), max(1, rpm/60)),
		tokens:   rate.NewLimiter(rate.Limit(float64(tpm)/60), max(1, tpm/10)),
	}
}

// quotaFor is the quota a request for model takes from.
func (s *Server) quotaFor(model string) *quota {
	if q, ok := s.models[model]; ok {
		return q
	}
	return s.quota
}

// HangNext makes the next n calls that are not rate-limited hang until
// their clients give up, as a provider that stopped answering does.
func (s *Server) HangNext(n int) {
	s.mu.Lock()
	s.hangNext += n
	s.mu.Unlock()
}

// MalformNext answers the next n calls that are not rate-limited with
// malformed JSON.
func (s *Server) MalformNext(n int) {
	s.mu.Lock()
	s.malformNxt += n
	s.mu.Unlock()
}

// FailNext answers the next n calls that are not rate-limited with 500, as
// a provider with an internal error does.
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	s.failNext += n
	s.mu.Unlock()
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	return Stats{
		Calls: s.calls64.Load(), Answered: s.answered.Load(), RateLimited: s.limited.Load(),
		Timeouts: s.timeouts.Load(), Malformed: s.malformed.Load(), Wrong: s.wrong.Load(), BadRequests: s.bad.Load(),
		ServerErrors: s.serverErrors.Load(), Overloaded: s.overloaded.Load(),

		BatchesCreated: s.batches.created.Load(), BatchesRefused: s.batches.refused.Load(),
		BatchRequestsAnswered: s.batches.answered.Load(), BatchRequestsErrored: s.batches.errored.Load(),
		BatchRequestsExpired: s.batches.expired.Load(), BatchRequestsCancelled: s.batches.cancelled.Load(),
	}
}

// ChatRequest is the part of an OpenAI chat-completions request the fake reads.
type ChatRequest struct {
	Model     string        `json:"model"`
	Messages  []ChatMessage `json:"messages"`
	MaxTokens int           `json:"max_tokens,omitempty"`
}

// ChatMessage is one message of a chat request or answer.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatResponse is an OpenAI chat-completions answer.
type ChatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   Usage        `json:"usage"`
}

// ChatChoice is one answer choice.
type ChatChoice struct {
	Index        int         `json:"index"`
	Message      ChatMessage `json:"message"`
	FinishReason string      `json:"finish_reason"`
}

// Usage is the token usage a provider reports.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type fault int

const (
	faultNone fault = iota
	faultTimeout
	faultMalformed
	faultWrongIBAN
	faultBadTotal
	faultServerError
	faultBadRequest // a batch request the provider refuses ("[[fake:batch-400]]")
)

var faultNames = [...]string{faultNone: "", faultTimeout: "timeout", faultMalformed: "malformed", faultWrongIBAN: "wrong-iban", faultBadTotal: "bad-total", faultServerError: "server-error", faultBadRequest: "bad-request"}

// request is what the fake reads of a request, in either API.
type request struct {
	model       string
	document    string // the user messages' text
	promptChars int
	maxTokens   int
	apiKey      string
}

// promptTokens is the usage the fake reports for the request's prompt: a
// quarter of its characters, as providers roughly count.
func (r request) promptTokens() int64 { return int64(r.promptChars/4 + 1) }

// dialect is one provider API: how its requests read and its answers,
// errors and rate-limit headers are written. A batch request's body reads
// and its answer writes as a synchronous call's does.
type dialect struct {
	name        string
	apiKey      func(h http.Header) string
	decode      func(body []byte) (request, error)
	rateHeaders func(h http.Header, l levels, now time.Time)
	// overloaded and overloadedMessage are the status and message the
	// API answers, with an errOverloaded body, when it has no capacity
	// for the model (OutageModel).
	overloaded        int
	overloadedMessage string
	errorBody         func(kind errorKind, msg string) any
	answerBody        func(id string, created time.Time, model, content string, usage Usage) any
}

// parse reads a synchronous call's key and body.
func (d dialect) parse(r *http.Request) (request, error) {
	key := d.apiKey(r.Header)
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxRequestBody))
	if err != nil {
		return request{apiKey: key}, fmt.Errorf("body: %w", err)
	}
	req, err := d.decode(body)
	req.apiKey = key
	return req, err
}

func (d dialect) writeError(w http.ResponseWriter, status int, kind errorKind, msg string) {
	writeJSON(w, status, d.errorBody(kind, msg))
}

func (d dialect) writeAnswer(w http.ResponseWriter, id string, created time.Time, model, content string, usage Usage) {
	writeJSON(w, http.StatusOK, d.answerBody(id, created, model, content, usage))
}

// errorKind is an error's class, named by each API in its own words.
type errorKind int

const (
	errInvalidRequest errorKind = iota
	errRateLimit
	errServer
	errNotFound
	errOverloaded
)

func (s *Server) complete(w http.ResponseWriter, r *http.Request) { s.serve(w, r, openAI) }

func (s *Server) messages(w http.ResponseWriter, r *http.Request) { s.serve(w, r, anthropic) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request, d dialect) {
	s.calls64.Add(1)
	call := Call{Start: time.Now(), API: d.name}
	if s.cfg.OnCall != nil {
		defer func() {
			if f, ok := w.(http.Flusher); ok && call.Status != 0 {
				f.Flush()
			}
			call.End = time.Now()
			s.cfg.OnCall(call)
		}()
	}
	req, err := d.parse(r)
	call.APIKey = req.apiKey
	if err != nil {
		s.bad.Add(1)
		call.Status, call.Fault = http.StatusBadRequest, "bad-request"
		d.writeError(w, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	call.Model, call.Document = req.model, req.document
	promptTokens := req.promptTokens()
	maxOut := int64(cmpOr(req.maxTokens, 800))

	now := time.Now()
	q := s.quotaFor(req.model)
	switch wait, v := s.admit(now, req.model, q, promptTokens+maxOut); v {
	case overloaded:
		s.overloaded.Add(1)
		call.Status, call.Fault = d.overloaded, "overloaded"
		d.writeError(w, d.overloaded, errOverloaded, d.overloadedMessage)
		return
	case limited:
		s.limited.Add(1)
		d.rateHeaders(w.Header(), s.levels(q, now), now)
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		w.Header().Set("retry-after-ms", strconv.FormatInt(max(1, wait.Milliseconds()), 10))
		call.Status, call.Fault = http.StatusTooManyRequests, "rate-limited"
		d.writeError(w, http.StatusTooManyRequests, errRateLimit, "Rate limit reached; retry later")
		return
	}

	f, latency := s.decide(req.document)
	call.Fault = faultNames[f]
	if f == faultTimeout {
		s.timeouts.Add(1)
		<-r.Context().Done() // hang until the client gives up
		return
	}
	if f == faultServerError {
		s.serverErrors.Add(1)
		call.Status = http.StatusInternalServerError
		d.writeError(w, http.StatusInternalServerError, errServer, "The server had an error while processing your request")
		return
	}
	if s.cfg.Latency != nil {
		if err := s.cfg.Latency(r.Context(), promptTokens, maxOut); err != nil {
			if r.Context().Err() == nil {
				s.serverErrors.Add(1)
				call.Status = http.StatusInternalServerError
				d.writeError(w, http.StatusInternalServerError, errServer, err.Error())
			}
			return
		}
	} else {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}

	switch f {
	case faultMalformed:
		s.malformed.Add(1)
	case faultWrongIBAN, faultBadTotal:
		s.wrong.Add(1)
	}
	content, err := modelContent(f, req.document)
	if err != nil {
		call.Status = http.StatusInternalServerError
		d.writeError(w, http.StatusInternalServerError, errServer, err.Error())
		return
	}
	s.answered.Add(1)
	out := int64(len(content)/4 + 1)
	call.Status, call.PromptTokens, call.CompletionTokens = http.StatusOK, promptTokens, out
	at := time.Now()
	d.rateHeaders(w.Header(), s.levels(q, at), at)
	d.writeAnswer(w, strconv.FormatInt(s.calls64.Load(), 10), now, req.model, content,
		Usage{PromptTokens: promptTokens, CompletionTokens: out, TotalTokens: promptTokens + out})
}

// modelContent is the fake model's answer to document, with fault f done
// to it: the extraction as JSON, or JSON cut off mid-object.
func modelContent(f fault, document string) (string, error) {
	if f == faultMalformed {
		return `{"supplier_name": "` + firstLine(document) + `", "line_items": [`, nil // cut off mid-object
	}
	ex := Extract(document)
	switch f {
	case faultWrongIBAN:
		ex.IBAN = "GB33BUKB20201555555555"
		ex.Evidence["iban"] = "IBAN: GB33BUKB20201555555555"
	case faultBadTotal:
		ex.Total = addCents(ex.Total, 10000)
		ex.Evidence["total"] = "Total: " + ex.Total
	}
	b, err := json.Marshal(ex)
	if err != nil {
		return "", fmt.Errorf("encoding the extraction: %w", err)
	}
	return string(b), nil
}

// verdict is admit's answer to a call.
type verdict int

const (
	admitted   verdict = iota
	limited            // 429, for a storm or an empty bucket
	overloaded         // the model's outage (OutageModel)
)

// admit refuses a call for model during its outage, or during a storm
// (the server's or model's) with how long is left of it; otherwise it
// takes one request and tokens from q's per-minute buckets, or says how
// long until they would be there.
func (s *Server) admit(now time.Time, model string, q *quota, tokens int64) (time.Duration, verdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stormNext > 0 {
		s.stormUntil, s.stormNext = now.Add(s.stormNext), 0
	}
	mf := s.faults[model]
	if now.Before(mf.outageUntil) {
		return 0, overloaded
	}
	if until := later(s.stormUntil, mf.stormUntil); now.Before(until) {
		return until.Sub(now), limited
	}
	rr := q.requests.ReserveN(now, 1)
	tr := q.tokens.ReserveN(now, int(min(tokens, int64(q.tokens.Burst()))))
	wait := max(rr.DelayFrom(now), tr.DelayFrom(now))
	if wait > 0 {
		rr.CancelAt(now)
		tr.CancelAt(now)
		return wait, limited
	}
	return 0, admitted
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// refill is how long a bucket takes to gain missing units at perSecond.
func refill(missing, perSecond float64) time.Duration {
	if missing <= 0 {
		return 0
	}
	return time.Duration(missing / perSecond * float64(time.Second)).Round(time.Millisecond)
}

var markers = []struct {
	text  string
	fault fault
	once  bool
}{
	{"[[fake:timeout-once]]", faultTimeout, true},
	{"[[fake:malformed-once]]", faultMalformed, true},
	{"[[fake:malformed]]", faultMalformed, false},
	{"[[fake:wrong-iban]]", faultWrongIBAN, false},
	{"[[fake:bad-total]]", faultBadTotal, false},
}

// batchMarkers are the faults only a request inside a batch can meet: a
// synchronous call has no status line of its own to put them in.
var batchMarkers = []struct {
	text  string
	fault fault
}{
	{"[[fake:batch-400]]", faultBadRequest},
	{"[[fake:batch-500]]", faultServerError},
}

// decide picks the call's fault and latency: run-time faults first, then
// the markers, then the rates.
func (s *Server) decide(text string) (fault, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.count(text)
	mean := float64(s.cfg.MeanLatency) / s.cfg.Scale
	latency := time.Duration(mean * (0.5 + 0.5*s.rnd.ExpFloat64()))
	if s.hangNext > 0 {
		s.hangNext--
		return faultTimeout, latency
	}
	if s.malformNxt > 0 {
		s.malformNxt--
		return faultMalformed, latency
	}
	if s.failNext > 0 {
		s.failNext--
		return faultServerError, latency
	}
	return s.documentFault(text, n), latency
}

// decideBatch picks the fault of a request inside a batch: the batch
// markers, then decide's markers and rates. The run-time faults (HangNext,
// MalformNext, FailNext) are left to the synchronous calls they were
// aimed at, and a hang becomes a 500: inside a batch no client is there to
// give up.
func (s *Server) decideBatch(text string) fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.count(text)
	for _, m := range batchMarkers {
		if strings.Contains(text, m.text) {
			return m.fault
		}
	}
	if f := s.documentFault(text, n); f != faultTimeout {
		return f
	}
	return faultServerError
}

// count counts a call for text and returns how many it has had, for the
// "-once" markers. The caller holds s.mu.
func (s *Server) count(text string) int {
	key := sha256.Sum256([]byte(text))
	s.calls[key]++
	return s.calls[key]
}

// documentFault is the fault text's markers ask for on its nth call, or
// one drawn from the rates. The caller holds s.mu.
func (s *Server) documentFault(text string, n int) fault {
	for _, m := range markers {
		if strings.Contains(text, m.text) && (!m.once || n == 1) {
			return m.fault
		}
	}
	p := s.rnd.Float64()
	switch {
	case p < s.cfg.TimeoutRate:
		return faultTimeout
	case p < s.cfg.TimeoutRate+s.cfg.MalformedRate:
		return faultMalformed
	case p < s.cfg.TimeoutRate+s.cfg.MalformedRate+s.cfg.WrongRate:
		return faultWrongIBAN
	}
	return faultNone
}

func cmpOr(a, b int) int {
	if a > 0 {
		return a
	}
	return b
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strconv.Quote(line)[1 : len(strconv.Quote(line))-1]
}

// Extraction is what the fake model returns, in the invoice example's schema.
// It is a copy of invoice.Extraction on purpose: the provider and the service
// are separate systems that agree on JSON, and the service must not depend
// on its test double.
type Extraction struct {
	SupplierName  string            `json:"supplier_name"`
	InvoiceNumber string            `json:"invoice_number"`
	InvoiceDate   string            `json:"invoice_date"`
	Currency      string            `json:"currency"`
	IBAN          string            `json:"iban"`
	LineItems     []LineItem        `json:"line_items"`
	Subtotal      string            `json:"subtotal"`
	Tax           string            `json:"tax"`
	Total         string            `json:"total"`
	Evidence      map[string]string `json:"evidence"`
	SendTo        string            `json:"send_to,omitempty"`
}

// LineItem is one invoice line; amounts are decimal strings.
type LineItem struct {
	Description string `json:"description"`
	Quantity    string `json:"quantity"`
	UnitPrice   string `json:"unit_price"`
	Amount      string `json:"amount"`
}

// fieldNames maps the document's labels to the extraction's fields.
var fieldNames = map[string]string{
	"Supplier": "supplier_name", "Invoice number": "invoice_number", "Date": "invoice_date", "Currency": "currency",
	"IBAN": "iban", "Subtotal": "subtotal", "Tax": "tax", "Total": "total",
}

var (
	fieldRe     = regexp.MustCompile(`(?m)^(Supplier|Invoice number|Date|Currency|IBAN|Subtotal|Tax|Total):[ \t]*(.*?)[ \t]*$`)
	itemRe      = regexp.MustCompile(`(?m)^- (.+?) \| ([0-9.]+) x ([0-9.]+) = ([0-9.]+)[ \t]*$`)
	injectionRe = regexp.MustCompile(`(?i)ignore (all )?previous (rules|instructions)[^\n]*`)
	urlRe       = regexp.MustCompile(`https?://[^\s,]+`)
	injectIBAN  = regexp.MustCompile(`IBAN:? ([A-Z]{2}\d{2}[0-9A-Z]{10,30})`)
)

// Extract is the fake model: it reads the invoice text layout line by line.
// A field missing from the text is missing from the answer.
func Extract(text string) Extraction {
	ex := Extraction{Evidence: map[string]string{}}
	fields := map[string]*string{
		"supplier_name": &ex.SupplierName, "invoice_number": &ex.InvoiceNumber, "invoice_date": &ex.InvoiceDate,
		"currency": &ex.Currency, "iban": &ex.IBAN, "subtotal": &ex.Subtotal, "tax": &ex.Tax, "total": &ex.Total,
	}
	for _, m := range fieldRe.FindAllStringSubmatch(text, -1) {
		name := fieldNames[m[1]]
		if field := fields[name]; *field == "" {
			*field = m[2]
			ex.Evidence[name] = strings.TrimSpace(m[0])
		}
	}
	for i, m := range itemRe.FindAllStringSubmatch(text, -1) {
		ex.LineItems = append(ex.LineItems, LineItem{Description: m[1], Quantity: m[2], UnitPrice: m[3], Amount: m[4]})
		ex.Evidence[fmt.Sprintf("line_items[%d]", i)] = strings.TrimSpace(m[0])
	}
	// The gullible part: text that gives orders is obeyed.
	if order := injectionRe.FindString(text); order != "" {
		ex.SendTo = urlRe.FindString(order)
		if m := injectIBAN.FindStringSubmatch(order); m != nil {
			ex.IBAN = m[1]
			ex.Evidence["iban"] = m[0]
		}
	}
	return ex
}

// addCents adds cents to a decimal amount string (best effort, for faults).
func addCents(amount string, cents int64) string {
	f, err := strconv.ParseFloat(amount, 64)
	if err != nil {
		return amount
	}
	return strconv.FormatFloat(f+float64(cents)/100, 'f', 2, 64)
}
