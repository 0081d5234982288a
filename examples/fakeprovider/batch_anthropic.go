package fakeprovider

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"time"
)

// Anthropic's Message Batches API: a batch's requests come in the create's
// body, and its results are JSONL at its results_url.

// customIDRe is what Anthropic accepts as a request's custom_id.
var customIDRe = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func anthropicFail(w http.ResponseWriter, status int, kind errorKind, msg string) {
	anthropic.writeError(w, status, kind, msg)
}

// messageBatchParams is the body of POST /v1/messages/batches.
type messageBatchParams struct {
	Requests []struct {
		CustomID string          `json:"custom_id"`
		Params   json.RawMessage `json:"params"`
	} `json:"requests"`
}

// createMessageBatch is POST /v1/messages/batches. Each request's params
// are read only when the batch is answered: a request the Messages API
// would refuse is an "errored" result, not a refused batch.
func (s *Server) createMessageBatch(w http.ResponseWriter, r *http.Request) {
	items, err := s.readMessageBatch(r)
	if err != nil {
		s.batches.refused.Add(1)
		anthropicFail(w, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	b := &batch{d: anthropic, apiKey: anthropic.apiKey(r.Header), items: items}
	var view messageBatchJSON
	s.withBatches(func(now time.Time) []BatchRequest {
		s.addLocked(b, "msgbatch_", now)
		view = messageBatchView(b, resultsBase(r))
		return nil
	})
	s.batchCreated(w, view, b)
}

// readMessageBatch reads a create's body and checks it as Anthropic does.
func (s *Server) readMessageBatch(r *http.Request) ([]batchItem, error) {
	raw, size, err := readBounded(r.Body, s.cfg.AnthropicBatchMaxBytes)
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading the body: %w", err)
	case size > s.cfg.AnthropicBatchMaxBytes:
		return nil, fmt.Errorf("the batch is %d bytes, over the limit of %d", size, s.cfg.AnthropicBatchMaxBytes)
	}
	var p messageBatchParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	switch n := len(p.Requests); {
	case n == 0:
		return nil, errors.New("requests: at least one request is required")
	case n > s.cfg.AnthropicBatchMaxRequests:
		return nil, fmt.Errorf("requests: %d, over the limit of %d", n, s.cfg.AnthropicBatchMaxRequests)
	}
	items := make([]batchItem, len(p.Requests))
	seen := map[string]int{}
	for i, req := range p.Requests {
		switch j, dup := seen[req.CustomID]; {
		case !customIDRe.MatchString(req.CustomID):
			return nil, fmt.Errorf("requests.%d.custom_id %q: want 1 to 64 of a-z, A-Z, 0-9, _ and -", i, req.CustomID)
		case dup:
			return nil, fmt.Errorf("requests.%d.custom_id %q is requests.%d's too: custom ids are unique in a batch", i, req.CustomID, j)
		case len(req.Params) == 0 || string(req.Params) == "null":
			return nil, fmt.Errorf("requests.%d.params: required", i)
		}
		seen[req.CustomID] = i
		items[i] = batchItem{customID: req.CustomID, body: req.Params}
	}
	return items, nil
}

// resultsBase is the scheme and host a batch's results_url names: the
// server's as the client reached it.
func resultsBase(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// messageBatchJSON is Anthropic's Message Batch object. Times are RFC
// 3339, null until they happen.
type messageBatchJSON struct {
	ID                string             `json:"id"`
	Type              string             `json:"type"`
	ProcessingStatus  string             `json:"processing_status"`
	RequestCounts     messageBatchCounts `json:"request_counts"`
	ResultsURL        *string            `json:"results_url"`
	CreatedAt         time.Time          `json:"created_at"`
	ExpiresAt         time.Time          `json:"expires_at"`
	EndedAt           *time.Time         `json:"ended_at"`
	CancelInitiatedAt *time.Time         `json:"cancel_initiated_at"`
	ArchivedAt        *time.Time         `json:"archived_at"`
}

type messageBatchCounts struct {
	Processing int64 `json:"processing"`
	Succeeded  int64 `json:"succeeded"`
	Errored    int64 `json:"errored"`
	Canceled   int64 `json:"canceled"`
	Expired    int64 `json:"expired"`
}

func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// messageBatchView is b's batch object; the caller holds the batch lock.
func messageBatchView(b *batch, base string) messageBatchJSON {
	v := messageBatchJSON{
		ID: b.id, Type: "message_batch", ProcessingStatus: "in_progress",
		CreatedAt: b.created.UTC(), ExpiresAt: b.created.Add(batchWindow).UTC(),
		CancelInitiatedAt: timeOrNull(b.cancelAt),
	}
	switch {
	case b.state == batchCancelling:
		v.ProcessingStatus = "canceling"
	case b.state.ended():
		url := base + "/v1/messages/batches/" + b.id + "/results"
		v.ProcessingStatus, v.EndedAt, v.ResultsURL = "ended", timeOrNull(b.endedAt), &url
		c := &v.RequestCounts
		c.Succeeded, c.Errored, c.Expired, c.Canceled = b.counts()
		return v
	}
	v.RequestCounts.Processing = int64(len(b.items))
	return v
}

// getMessageBatch is GET /v1/messages/batches/{id}.
func (s *Server) getMessageBatch(w http.ResponseWriter, r *http.Request) {
	s.messageBatchAction(w, r, func(*batch, time.Time) string { return "" })
}

// cancelMessageBatch is POST /v1/messages/batches/{id}/cancel: the batch is
// "canceling" until its next read, then ended with its requests
// "canceled".
func (s *Server) cancelMessageBatch(w http.ResponseWriter, r *http.Request) {
	s.messageBatchAction(w, r, func(b *batch, now time.Time) string {
		switch b.state {
		case batchRunning:
			b.state, b.cancelAt = batchCancelling, now
		case batchCancelling:
		default:
			return fmt.Sprintf("message batch %s has ended and cannot be canceled", b.id)
		}
		return ""
	})
}

// messageBatchAction runs act on the batch named by the path, then answers
// with the batch, or with 400 and what act refused.
func (s *Server) messageBatchAction(w http.ResponseWriter, r *http.Request, act func(*batch, time.Time) (refused string)) {
	id := r.PathValue("id")
	var (
		view    messageBatchJSON
		found   bool
		refused string
	)
	s.withBatches(func(now time.Time) []BatchRequest {
		b := s.findLocked(anthropic, id)
		if found = b != nil; found {
			if refused = act(b, now); refused == "" {
				view = messageBatchView(b, resultsBase(r))
			}
		}
		return nil
	})
	switch {
	case !found:
		anthropicFail(w, http.StatusNotFound, errNotFound, fmt.Sprintf("message batch %s not found", id))
	case refused != "":
		anthropicFail(w, http.StatusBadRequest, errInvalidRequest, refused)
	default:
		writeJSON(w, http.StatusOK, view)
	}
}

// listMessageBatches is GET /v1/messages/batches?after_id=&before_id=&limit=,
// newest first.
func (s *Server) listMessageBatches(w http.ResponseWriter, r *http.Request) {
	limit, err := listLimit(r, 20, 1000)
	if err != nil {
		anthropicFail(w, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	var out struct {
		Data    []messageBatchJSON `json:"data"`
		HasMore bool               `json:"has_more"`
		FirstID *string            `json:"first_id"`
		LastID  *string            `json:"last_id"`
	}
	out.Data = []messageBatchJSON{}
	q := r.URL.Query()
	s.withBatches(func(time.Time) []BatchRequest {
		var data []*batch
		data, out.HasMore = page(s.newestLocked(anthropic), q.Get("after_id"), q.Get("before_id"), limit)
		out.FirstID, out.LastID = pageIDs(data)
		for _, b := range data {
			out.Data = append(out.Data, messageBatchView(b, resultsBase(r)))
		}
		return nil
	})
	writeJSON(w, http.StatusOK, out)
}

// messageBatchResultLine is one line of a batch's results.
type messageBatchResultLine struct {
	CustomID string             `json:"custom_id"`
	Result   messageBatchResult `json:"result"`
}

type messageBatchResult struct {
	Type    string          `json:"type"`
	Message json.RawMessage `json:"message,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

var resultTypes = [...]string{resultSucceeded: "succeeded", resultErrored: "errored", resultExpired: "expired", resultCanceled: "canceled"}

// messageBatchResults is GET /v1/messages/batches/{id}/results, the path
// results_url names: JSONL, one line per request, once the batch ended.
func (s *Server) messageBatchResults(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var b *batch
	ended := false
	s.withBatches(func(time.Time) []BatchRequest {
		if b = s.findLocked(anthropic, id); b != nil {
			ended = b.state.ended()
		}
		return nil
	})
	switch {
	case b == nil:
		anthropicFail(w, http.StatusNotFound, errNotFound, fmt.Sprintf("message batch %s not found", id))
		return
	case !ended:
		anthropicFail(w, http.StatusBadRequest, errInvalidRequest, fmt.Sprintf("message batch %s has not ended: its results are not available yet", id))
		return
	}
	// An ended batch's items and results no longer change: they are read
	// without the lock.
	w.Header().Set("Content-Type", "application/x-jsonl")
	enc := json.NewEncoder(w)
	for i, res := range b.results {
		line := messageBatchResultLine{CustomID: b.items[i].customID, Result: messageBatchResult{Type: resultTypes[res.kind]}}
		switch res.kind {
		case resultSucceeded:
			line.Result.Message = res.body
		case resultErrored:
			line.Result.Error = res.body
		}
		if err := enc.Encode(line); err != nil {
			return // the client went away
		}
	}
}
