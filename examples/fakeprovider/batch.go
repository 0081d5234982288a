package fakeprovider

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// BatchCreated describes a batch just created, for Config.OnBatchCreate.
type BatchCreated struct {
	// API is the batch API: "openai" or "anthropic".
	API string
	// ID is the batch's id.
	ID string
	// Requests is how many requests the batch holds.
	Requests int
	// Metadata is the batch's metadata as created: OpenAI's; nil for
	// Anthropic, whose batches have none.
	Metadata map[string]string
}

// BatchRequest describes one request answered inside a batch, for
// Config.OnBatchRequest.
type BatchRequest struct {
	BatchID, CustomID string
	// Call is the request as Config.OnCall sees it too, with API
	// "openai-batch" or "anthropic-batch".
	Call
}

// Batch defaults, as the providers document their limits.
const (
	defaultBatchDelay         = 10 * time.Minute
	defaultOpenAIMaxFileBytes = 200 << 20
	defaultOpenAIMaxRequests  = 50_000
	defaultAnthropicMaxReqs   = 100_000
	defaultAnthropicMaxBytes  = 256 << 20
	// batchWindow is both APIs' completion window: what expires_at says.
	// The fake expires batches only on ExpireBatches.
	batchWindow = 24 * time.Hour
)

// routeBatches serves both batch APIs at the paths their SDKs call.
func (s *Server) routeBatches() {
	s.mux.HandleFunc("POST /v1/files", s.uploadFile)
	s.mux.HandleFunc("GET /v1/files/{id}", s.getFile)
	s.mux.HandleFunc("DELETE /v1/files/{id}", s.deleteFile)
	s.mux.HandleFunc("GET /v1/files/{id}/content", s.fileContent)
	s.mux.HandleFunc("POST /v1/batches", s.createOpenAIBatch)
	s.mux.HandleFunc("GET /v1/batches", s.listOpenAIBatches)
	s.mux.HandleFunc("GET /v1/batches/{id}", s.getOpenAIBatch)
	s.mux.HandleFunc("POST /v1/batches/{id}/cancel", s.cancelOpenAIBatch)
	s.mux.HandleFunc("POST /v1/messages/batches", s.createMessageBatch)
	s.mux.HandleFunc("GET /v1/messages/batches", s.listMessageBatches)
	s.mux.HandleFunc("GET /v1/messages/batches/{id}", s.getMessageBatch)
	s.mux.HandleFunc("POST /v1/messages/batches/{id}/cancel", s.cancelMessageBatch)
	s.mux.HandleFunc("GET /v1/messages/batches/{id}/results", s.messageBatchResults)
}

func batchDefaults(cfg Config) Config {
	if cfg.BatchDelay <= 0 {
		cfg.BatchDelay = defaultBatchDelay
	}
	if cfg.OpenAIBatchMaxFileBytes <= 0 {
		cfg.OpenAIBatchMaxFileBytes = defaultOpenAIMaxFileBytes
	}
	if cfg.OpenAIBatchMaxRequests <= 0 {
		cfg.OpenAIBatchMaxRequests = defaultOpenAIMaxRequests
	}
	if cfg.AnthropicBatchMaxRequests <= 0 {
		cfg.AnthropicBatchMaxRequests = defaultAnthropicMaxReqs
	}
	if cfg.AnthropicBatchMaxBytes <= 0 {
		cfg.AnthropicBatchMaxBytes = defaultAnthropicMaxBytes
	}
	return cfg
}

// batchStore holds both APIs' batches and OpenAI's files. Its lock is taken
// before Server.mu (answering a batch request decides its fault under
// both), never after.
type batchStore struct {
	mu sync.Mutex
	// nonce tells one server's ids from another's, so that a client
	// talking to a restarted fake does not find its old ids answered by
	// different batches.
	nonce string
	seq   int
	held  bool
	list  []*batch // oldest first
	byID  map[string]*batch
	files map[string]*file

	created, refused, answered, errored, expired, cancelled atomic.Int64
}

func newBatchStore() *batchStore {
	return &batchStore{
		nonce: strconv.FormatUint(rand.Uint64()>>16, 36), //nolint:gosec // ids, not secrets
		byID:  map[string]*batch{},
		files: map[string]*file{},
	}
}

// nextID is a new id with prefix. The caller holds mu.
func (st *batchStore) nextID(prefix string) string {
	st.seq++
	return fmt.Sprintf("%s%s%06d", prefix, st.nonce, st.seq)
}

type batchState int

const (
	batchRunning batchState = iota
	batchCancelling
	batchCompleted
	batchFailed
	batchExpired
	batchCancelled
)

func (st batchState) ended() bool { return st >= batchCompleted }

// batch is one batch of either API. Its requests are answered all at once,
// when it completes; until then it holds none of their answers.
type batch struct {
	d         dialect
	id        string
	created   time.Time
	apiKey    string
	model     string // OpenAI: the model every request names
	tokens    int64  // estimated input tokens, for OpenAI's enqueued-token limit
	metadata  map[string]string
	inputFile string
	items     []batchItem

	state             batchState
	cancelAt, endedAt time.Time
	failure           string   // why a failed batch failed
	results           []result // one per item once ended; none when failed
	outputFile        string   // OpenAI's output and error files, "" when empty
	errorFile         string
}

type batchItem struct {
	customID string
	body     json.RawMessage
}

type resultKind int

const (
	resultSucceeded resultKind = iota
	resultErrored
	resultExpired
	resultCanceled
)

// result is what became of one request of an ended batch.
type result struct {
	kind   resultKind
	status int             // the answer's HTTP status (succeeded and errored)
	body   json.RawMessage // the answer: a completion or message, or the API's error body
	usage  Usage
	id     string // the request's id, for OpenAI's output lines
}

// counts tallies the results of an ended batch.
func (b *batch) counts() (succeeded, errored, expired, canceled int64) {
	for _, r := range b.results {
		switch r.kind {
		case resultSucceeded:
			succeeded++
		case resultErrored:
			errored++
		case resultExpired:
			expired++
		case resultCanceled:
			canceled++
		}
	}
	return
}

// batchDelay is how long a batch takes to complete.
func (s *Server) batchDelay() time.Duration {
	return time.Duration(float64(s.cfg.BatchDelay) / s.cfg.Scale)
}

// withBatches runs fn under the batch lock once every batch is brought up
// to now, then calls the hooks for the requests answered meanwhile: a
// batch progresses only when something reads it, so no goroutine runs it.
func (s *Server) withBatches(fn func(now time.Time) []BatchRequest) {
	st := s.batches
	st.mu.Lock()
	now := time.Now()
	done := s.settleLocked(now)
	done = append(done, fn(now)...)
	st.mu.Unlock()
	s.batchHooks(done)
}

func (s *Server) batchHooks(done []BatchRequest) {
	for _, br := range done {
		if s.cfg.OnBatchRequest != nil {
			s.cfg.OnBatchRequest(br)
		}
		if s.cfg.OnCall != nil {
			s.cfg.OnCall(br.Call)
		}
	}
}

// settleLocked ends the batches being cancelled and completes those whose
// delay has passed, unless held. The caller holds the batch lock.
func (s *Server) settleLocked(now time.Time) []BatchRequest {
	var done []BatchRequest
	for _, b := range s.batches.list {
		switch {
		case b.state == batchCancelling:
			s.endLocked(b, batchCancelled, now)
		case b.state == batchRunning && !s.batches.held && now.Sub(b.created) >= s.batchDelay():
			done = append(done, s.completeLocked(b, now)...)
		}
	}
	return done
}

// HoldBatches stops batches from completing however long they run, until
// ReleaseBatches; AdvanceBatches, ExpireBatches and cancels still act.
func (s *Server) HoldBatches() {
	s.batches.mu.Lock()
	s.batches.held = true
	s.batches.mu.Unlock()
}

// ReleaseBatches undoes HoldBatches: batches whose delay has passed
// complete at their next read.
func (s *Server) ReleaseBatches() {
	s.batches.mu.Lock()
	s.batches.held = false
	s.batches.mu.Unlock()
}

// AdvanceBatches completes up to n running batches now, oldest first, held
// or not, and returns how many it completed. Batches whose delay had
// already passed complete too and are not counted.
func (s *Server) AdvanceBatches(n int) int {
	advanced := 0
	s.withBatches(func(now time.Time) []BatchRequest {
		var done []BatchRequest
		for _, b := range s.batches.list {
			if advanced == n {
				break
			}
			if b.state == batchRunning {
				done = append(done, s.completeLocked(b, now)...)
				advanced++
			}
		}
		return done
	})
	return advanced
}

// ExpireBatches ends every running batch now as its completion window
// would: none of its requests answered (OpenAI: status "expired", each
// request in the error file with code "batch_expired"; Anthropic: ended,
// each result "expired"). It returns how many batches expired. A batch
// being cancelled ends cancelled instead.
func (s *Server) ExpireBatches() int {
	expired := 0
	s.withBatches(func(now time.Time) []BatchRequest {
		for _, b := range s.batches.list {
			if b.state == batchRunning {
				s.endLocked(b, batchExpired, now)
				expired++
			}
		}
		return nil
	})
	return expired
}

// completeLocked answers every request of b and ends it completed.
func (s *Server) completeLocked(b *batch, now time.Time) []BatchRequest {
	b.results = make([]result, len(b.items))
	done := make([]BatchRequest, len(b.items))
	for i, it := range b.items {
		r, call := s.answerLocked(b, it, now)
		b.results[i] = r
		done[i] = BatchRequest{BatchID: b.id, CustomID: it.customID, Call: call}
	}
	s.endLocked(b, batchCompleted, now)
	return done
}

// answerLocked is the fake model's answer to one request of b, as the
// synchronous path answers it but at once and outside the RPM and TPM
// buckets: a batch has its own quota.
func (s *Server) answerLocked(b *batch, it batchItem, now time.Time) (result, Call) {
	id := s.batches.nextID("")
	call := Call{Start: now, End: now, API: b.d.name + "-batch", APIKey: b.apiKey}
	req, err := b.d.decode(it.body)
	call.Model = req.model
	if err != nil {
		call.Status, call.Fault = http.StatusBadRequest, faultNames[faultBadRequest]
		return s.erroredLocked(b, id, http.StatusBadRequest, errInvalidRequest, err.Error()), call
	}
	call.Document = req.document
	f := s.decideBatch(req.document)
	call.Fault = faultNames[f]
	switch f {
	case faultBadRequest:
		call.Status = http.StatusBadRequest
		return s.erroredLocked(b, id, call.Status, errInvalidRequest, "the request was refused ([[fake:batch-400]])"), call
	case faultServerError:
		call.Status = http.StatusInternalServerError
		return s.erroredLocked(b, id, call.Status, errServer, "The server had an error while processing your request"), call
	}
	content, err := modelContent(f, req.document)
	if err != nil {
		call.Status = http.StatusInternalServerError
		return s.erroredLocked(b, id, call.Status, errServer, err.Error()), call
	}
	usage := Usage{PromptTokens: req.promptTokens(), CompletionTokens: int64(len(content)/4 + 1)}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	body, err := json.Marshal(b.d.answerBody(id, now, req.model, content, usage))
	if err != nil {
		call.Status = http.StatusInternalServerError
		return s.erroredLocked(b, id, call.Status, errServer, err.Error()), call
	}
	s.batches.answered.Add(1)
	call.Status, call.PromptTokens, call.CompletionTokens = http.StatusOK, usage.PromptTokens, usage.CompletionTokens
	return result{kind: resultSucceeded, status: http.StatusOK, body: body, usage: usage, id: id}, call
}

// erroredLocked is a request of b answered with status and the API's error
// body.
func (s *Server) erroredLocked(b *batch, id string, status int, kind errorKind, msg string) result {
	s.batches.errored.Add(1)
	body, err := json.Marshal(b.d.errorBody(kind, msg))
	if err != nil { // a struct of strings always encodes
		panic(fmt.Sprintf("fakeprovider: encoding an error body: %v", err))
	}
	return result{kind: resultErrored, status: status, body: body, id: id}
}

// endLocked ends b in state: the requests not answered expire or are
// cancelled, and an OpenAI batch gets its output and error files.
func (s *Server) endLocked(b *batch, state batchState, now time.Time) {
	if b.results == nil && state != batchFailed {
		kind, counter := resultExpired, &s.batches.expired
		if state == batchCancelled {
			kind, counter = resultCanceled, &s.batches.cancelled
		}
		b.results = make([]result, len(b.items))
		for i := range b.results {
			b.results[i] = result{kind: kind, id: s.batches.nextID("")}
		}
		counter.Add(int64(len(b.items)))
	}
	b.state, b.endedAt = state, now
	if b.d.name == openAI.name && state != batchFailed {
		s.writeResultFilesLocked(b, now)
	}
}

// findLocked is the batch of d with id, or nil.
func (s *Server) findLocked(d dialect, id string) *batch {
	if b := s.batches.byID[id]; b != nil && b.d.name == d.name {
		return b
	}
	return nil
}

// addLocked stores a new batch of d created now.
func (s *Server) addLocked(b *batch, prefix string, now time.Time) {
	b.id, b.created = s.batches.nextID(prefix), now
	s.batches.list = append(s.batches.list, b)
	s.batches.byID[b.id] = b
}

// batchCreated writes a create's answer, flushes it, then tells
// Config.OnBatchCreate: the hook runs once the client could have the id.
func (s *Server) batchCreated(w http.ResponseWriter, view any, b *batch) {
	s.batches.created.Add(1)
	writeJSON(w, http.StatusOK, view)
	if s.cfg.OnBatchCreate == nil {
		return
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// A copy: the hook may keep or change its map while reads encode b's.
	s.cfg.OnBatchCreate(BatchCreated{API: b.d.name, ID: b.id, Requests: len(b.items), Metadata: maps.Clone(b.metadata)})
}

// page is up to limit of newest (newest first) after the batch with id
// after or, when before is set, before the one with id before, and whether
// more are left that way. An id not among newest pages nothing.
func page(newest []*batch, after, before string, limit int) ([]*batch, bool) {
	at := func(id string) int {
		for i, b := range newest {
			if b.id == id {
				return i
			}
		}
		return -1
	}
	switch {
	case before != "":
		i := at(before)
		if i < 0 {
			return nil, false
		}
		from := max(0, i-limit)
		return newest[from:i], from > 0
	case after != "":
		i := at(after)
		if i < 0 {
			return nil, false
		}
		newest = newest[i+1:]
	}
	if len(newest) > limit {
		return newest[:limit], true
	}
	return newest, false
}

// newestLocked is d's batches, newest first.
func (s *Server) newestLocked(d dialect) []*batch {
	var out []*batch
	for i := len(s.batches.list) - 1; i >= 0; i-- {
		if b := s.batches.list[i]; b.d.name == d.name {
			out = append(out, b)
		}
	}
	return out
}

// listLimit reads a list's limit query parameter: def when absent, else
// an integer from 1 to most.
func listLimit(r *http.Request, def, most int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, fmt.Errorf("limit %q: want an integer from 1 to %d", v, most)
	}
	return n, nil
}

// pageIDs are a list page's first and last ids, null when it is empty.
func pageIDs(data []*batch) (first, last *string) {
	if len(data) == 0 {
		return nil, nil
	}
	return &data[0].id, &data[len(data)-1].id
}

// readBounded reads r up to limit bytes and returns them with r's size.
// Past the limit it holds no content but still counts the whole size, so
// that a refusal can name it.
func readBounded(r io.Reader, limit int64) ([]byte, int64, error) {
	buf, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, 0, err
	}
	if int64(len(buf)) <= limit {
		return buf, int64(len(buf)), nil
	}
	rest, err := io.Copy(io.Discard, r)
	return nil, int64(len(buf)) + rest, err
}
