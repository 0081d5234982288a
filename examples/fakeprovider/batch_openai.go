package fakeprovider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// OpenAI's Batch API: files uploaded with purpose "batch", batches on them,
// and the output and error files the batches leave.

const (
	chatEndpoint = "/v1/chat/completions"
	// OpenAI's bounds on a batch's metadata.
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// file is an uploaded input file or a batch's output or error file.
type file struct {
	id, name, purpose string
	size              int64 // all of the upload, even past the limit
	created           time.Time
	// content is nil for an upload past OpenAIBatchMaxFileBytes: such a
	// file is only ever refused, and the fake need not hold it.
	content []byte
}

// fileJSON is OpenAI's file object.
type fileJSON struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Status    string `json:"status"`
}

func (f *file) view() fileJSON {
	return fileJSON{ID: f.id, Object: "file", Bytes: f.size, CreatedAt: f.created.Unix(), Filename: f.name, Purpose: f.purpose, Status: "processed"}
}

// openAIFail answers status with OpenAI's error body: every error of the
// files and batches endpoints is an invalid_request_error.
func openAIFail(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, openAIErrorBody("invalid_request_error", msg))
}

func openAINotFound(w http.ResponseWriter, what, id string) {
	openAIFail(w, http.StatusNotFound, fmt.Sprintf("No such %s: %s", what, id))
}

// uploadFile is POST /v1/files: multipart, with a "purpose" and a "file".
func (s *Server) uploadFile(w http.ResponseWriter, r *http.Request) {
	f, err := s.readUpload(r)
	if err != nil {
		openAIFail(w, http.StatusBadRequest, err.Error())
		return
	}
	s.batches.mu.Lock()
	f.id = s.batches.nextID("file-")
	s.batches.files[f.id] = f
	s.batches.mu.Unlock()
	writeJSON(w, http.StatusOK, f.view())
}

// readUpload reads an upload's parts as they stream, holding at most
// OpenAIBatchMaxFileBytes of the file.
func (s *Server) readUpload(r *http.Request) (*file, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, fmt.Errorf("want a multipart/form-data body: %w", err)
	}
	f := &file{created: time.Now()}
	sawFile := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the multipart body: %w", err)
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, 64))
			if err != nil {
				return nil, fmt.Errorf("reading purpose: %w", err)
			}
			f.purpose = string(b)
		case "file":
			sawFile, f.name = true, part.FileName()
			if f.content, f.size, err = readBounded(part, s.cfg.OpenAIBatchMaxFileBytes); err != nil {
				return nil, fmt.Errorf("reading file: %w", err)
			}
		}
	}
	switch {
	case !sawFile:
		return nil, errors.New("file: required")
	case f.purpose != "batch":
		return nil, fmt.Errorf("purpose %q: the fake serves only purpose \"batch\"", f.purpose)
	}
	return f, nil
}

func (s *Server) fileByID(id string) *file {
	s.batches.mu.Lock()
	defer s.batches.mu.Unlock()
	return s.batches.files[id]
}

// getFile is GET /v1/files/{id}.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	f := s.fileByID(r.PathValue("id"))
	if f == nil {
		openAINotFound(w, "File object", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, f.view())
}

// deleteFile is DELETE /v1/files/{id}: a batch on the file keeps its
// requests.
func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.batches.mu.Lock()
	f := s.batches.files[id]
	delete(s.batches.files, id)
	s.batches.mu.Unlock()
	if f == nil {
		openAINotFound(w, "File object", id)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
}

// fileContent is GET /v1/files/{id}/content. As OpenAI does, it will not
// give back an input file.
func (s *Server) fileContent(w http.ResponseWriter, r *http.Request) {
	f := s.fileByID(r.PathValue("id"))
	switch {
	case f == nil:
		openAINotFound(w, "File object", r.PathValue("id"))
	case f.purpose == "batch":
		openAIFail(w, http.StatusBadRequest, "Not allowed to download files of purpose: batch")
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(f.content)
	}
}

// openAIBatchParams is the body of POST /v1/batches.
type openAIBatchParams struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

func (p openAIBatchParams) check() error {
	switch {
	case p.InputFileID == "":
		return errors.New("input_file_id: required")
	case p.Endpoint != chatEndpoint:
		return fmt.Errorf("endpoint %q: the fake serves only %s", p.Endpoint, chatEndpoint)
	case p.CompletionWindow != "24h":
		return fmt.Errorf("completion_window %q: want \"24h\"", p.CompletionWindow)
	case len(p.Metadata) > maxMetadataPairs:
		return fmt.Errorf("metadata: %d pairs, over the limit of %d", len(p.Metadata), maxMetadataPairs)
	}
	for k, v := range p.Metadata {
		if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return fmt.Errorf("metadata %q: keys are at most %d characters and values %d", k, maxMetadataKey, maxMetadataValue)
		}
	}
	return nil
}

// createOpenAIBatch is POST /v1/batches. A file OpenAI would refuse is
// refused with 400; a batch past the enqueued-token limit is created and
// failed at once, as OpenAI fails it at validation.
func (s *Server) createOpenAIBatch(w http.ResponseWriter, r *http.Request) {
	var p openAIBatchParams
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxRequestBody)).Decode(&p); err != nil {
		s.refuseOpenAI(w, fmt.Errorf("body: %w", err))
		return
	}
	if err := p.check(); err != nil {
		s.refuseOpenAI(w, err)
		return
	}
	in, err := s.readInputFile(p.InputFileID)
	if err != nil {
		s.refuseOpenAI(w, err)
		return
	}
	b := &batch{d: openAI, apiKey: bearer(r.Header), model: in.model, tokens: in.tokens, metadata: p.Metadata, inputFile: p.InputFileID, items: in.items}
	var view openAIBatchJSON
	s.withBatches(func(now time.Time) []BatchRequest {
		s.addLocked(b, "batch_", now)
		if limit := s.cfg.OpenAIEnqueuedTokenLimit; limit > 0 && s.enqueuedLocked(b.model) > limit {
			s.batches.refused.Add(1)
			b.failure = fmt.Sprintf("Enqueued token limit reached for %s in organization. Limit: %d enqueued tokens. Please try again once some in_progress batches have been completed.", b.model, limit)
			s.endLocked(b, batchFailed, now)
		}
		view = openAIView(b, true)
		return nil
	})
	s.batchCreated(w, view, b)
}

func (s *Server) refuseOpenAI(w http.ResponseWriter, err error) {
	s.batches.refused.Add(1)
	openAIFail(w, http.StatusBadRequest, err.Error())
}

// enqueuedLocked is the estimated input tokens of model's OpenAI batches
// not yet ended, the new one included.
func (s *Server) enqueuedLocked(model string) int64 {
	var sum int64
	for _, b := range s.batches.list {
		if b.d.name == openAI.name && b.model == model && !b.state.ended() {
			sum += b.tokens
		}
	}
	return sum
}

// inputFile is a batch's input file, read and checked.
type inputFile struct {
	items  []batchItem
	model  string
	tokens int64
}

// inputLine is one line of an input file.
type inputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// readInputFile reads the input file id and checks it as OpenAI does
// before it accepts a batch. A body the model would refuse is not checked
// here: that request is answered 400 in the batch.
func (s *Server) readInputFile(id string) (inputFile, error) {
	f := s.fileByID(id)
	switch {
	case f == nil:
		return inputFile{}, fmt.Errorf("input_file_id %q: no such file", id)
	case f.purpose != "batch":
		return inputFile{}, fmt.Errorf("input_file_id %q: purpose %q, want \"batch\"", id, f.purpose)
	case f.size > s.cfg.OpenAIBatchMaxFileBytes:
		return inputFile{}, fmt.Errorf("input file %s is %d bytes, over the limit of %d", id, f.size, s.cfg.OpenAIBatchMaxFileBytes)
	}
	var in inputFile
	seen := map[string]int{}
	n := 0
	for raw := range bytes.Lines(f.content) {
		n++
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		if len(in.items) == s.cfg.OpenAIBatchMaxRequests {
			return inputFile{}, fmt.Errorf("input file %s has more than %d requests", id, s.cfg.OpenAIBatchMaxRequests)
		}
		it, model, err := readInputLine(raw, seen, n)
		if err != nil {
			return inputFile{}, fmt.Errorf("input file %s, line %d: %w", id, n, err)
		}
		if in.model == "" {
			in.model = model
		} else if model != in.model {
			return inputFile{}, fmt.Errorf("input file %s, line %d: model %q, but the batch's is %q: a batch has one model", id, n, model, in.model)
		}
		in.items = append(in.items, it)
		in.tokens += estimateTokens(it.body)
	}
	if len(in.items) == 0 {
		return inputFile{}, fmt.Errorf("input file %s has no requests", id)
	}
	return in, nil
}

// readInputLine reads one line, numbered n, of an input file whose
// custom ids so far are in seen.
func readInputLine(raw []byte, seen map[string]int, n int) (batchItem, string, error) {
	var l inputLine
	if err := json.Unmarshal(raw, &l); err != nil {
		return batchItem{}, "", fmt.Errorf("not a JSON request: %w", err)
	}
	var body struct {
		Model string `json:"model"`
	}
	switch {
	case l.CustomID == "":
		return batchItem{}, "", errors.New("custom_id: required")
	case seen[l.CustomID] != 0:
		return batchItem{}, "", fmt.Errorf("custom_id %q is line %d's too: custom ids are unique in a batch", l.CustomID, seen[l.CustomID])
	case l.Method != http.MethodPost:
		return batchItem{}, "", fmt.Errorf("method %q: want POST", l.Method)
	case l.URL != chatEndpoint:
		return batchItem{}, "", fmt.Errorf("url %q: the batch's endpoint is %s", l.URL, chatEndpoint)
	case json.Unmarshal(l.Body, &body) != nil:
		return batchItem{}, "", errors.New("body: want a JSON object")
	}
	seen[l.CustomID] = n
	return batchItem{customID: l.CustomID, body: l.Body}, body.Model, nil
}

// estimateTokens is a request's input tokens as the synchronous path
// counts them, or, for a body it would refuse, a quarter of its bytes.
func estimateTokens(body []byte) int64 {
	if req, err := openAI.decode(body); err == nil {
		return req.promptTokens()
	}
	return int64(len(body)/4 + 1)
}

// openAIBatchJSON is OpenAI's batch object. Times are Unix seconds, null
// until they happen.
type openAIBatchJSON struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Endpoint         string             `json:"endpoint"`
	Model            string             `json:"model"`
	Errors           *openAIBatchErrors `json:"errors"`
	InputFileID      string             `json:"input_file_id"`
	CompletionWindow string             `json:"completion_window"`
	Status           string             `json:"status"`
	OutputFileID     *string            `json:"output_file_id"`
	ErrorFileID      *string            `json:"error_file_id"`
	CreatedAt        int64              `json:"created_at"`
	InProgressAt     *int64             `json:"in_progress_at"`
	ExpiresAt        *int64             `json:"expires_at"`
	FinalizingAt     *int64             `json:"finalizing_at"`
	CompletedAt      *int64             `json:"completed_at"`
	FailedAt         *int64             `json:"failed_at"`
	ExpiredAt        *int64             `json:"expired_at"`
	CancellingAt     *int64             `json:"cancelling_at"`
	CancelledAt      *int64             `json:"cancelled_at"`
	RequestCounts    openAIBatchCounts  `json:"request_counts"`
	Usage            openAIBatchUsage   `json:"usage"`
	Metadata         map[string]string  `json:"metadata"`
}

type openAIBatchErrors struct {
	Object string             `json:"object"`
	Data   []openAIBatchError `json:"data"`
}

type openAIBatchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

type openAIBatchCounts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

type openAIBatchUsage struct {
	InputTokens         int64          `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int64          `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int64          `json:"total_tokens"`
}

// openAIStatus names b's state; a batch just created is "validating", as
// OpenAI answers a create.
var openAIStatus = [...]string{batchRunning: "in_progress", batchCancelling: "cancelling", batchCompleted: "completed", batchFailed: "failed", batchExpired: "expired", batchCancelled: "cancelled"}

func unixOrNull(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	u := t.Unix()
	return &u
}

func idOrNull(id string) *string {
	if id == "" {
		return nil
	}
	return &id
}

// openAIView is b's batch object; the caller holds the batch lock.
func openAIView(b *batch, creating bool) openAIBatchJSON {
	v := openAIBatchJSON{
		ID: b.id, Object: "batch", Endpoint: chatEndpoint, Model: b.model, InputFileID: b.inputFile,
		CompletionWindow: "24h", Status: openAIStatus[b.state], CreatedAt: b.created.Unix(),
		ExpiresAt: unixOrNull(b.created.Add(batchWindow)), CancellingAt: unixOrNull(b.cancelAt),
		OutputFileID: idOrNull(b.outputFile), ErrorFileID: idOrNull(b.errorFile),
		RequestCounts: openAIBatchCounts{Total: int64(len(b.items))}, Metadata: b.metadata,
		Usage: openAIBatchUsage{InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}},
	}
	if creating {
		// A create is answered before validation, even of a batch that
		// fails it: the failure shows at the next read.
		v.Status, v.CancellingAt = "validating", nil
		return v
	}
	if b.state != batchFailed {
		v.InProgressAt = unixOrNull(b.created)
	}
	openAIEnded(b, &v)
	return v
}

// openAIEnded fills in what an ended batch adds to its object.
func openAIEnded(b *batch, v *openAIBatchJSON) {
	if !b.state.ended() {
		return
	}
	succeeded, errored, _, _ := b.counts()
	v.RequestCounts.Completed, v.RequestCounts.Failed = succeeded, errored
	for _, r := range b.results {
		v.Usage.InputTokens += r.usage.PromptTokens
		v.Usage.OutputTokens += r.usage.CompletionTokens
	}
	v.Usage.TotalTokens = v.Usage.InputTokens + v.Usage.OutputTokens
	switch b.state {
	case batchCompleted:
		v.FinalizingAt, v.CompletedAt = unixOrNull(b.endedAt), unixOrNull(b.endedAt)
	case batchExpired:
		v.ExpiredAt = unixOrNull(b.endedAt)
	case batchCancelled:
		v.CancelledAt = unixOrNull(b.endedAt)
	case batchFailed:
		// OpenAI counts no requests in a batch that failed validation.
		v.FailedAt, v.RequestCounts.Total = unixOrNull(b.endedAt), 0
		v.Errors = &openAIBatchErrors{Object: "list", Data: []openAIBatchError{{Code: "token_limit_exceeded", Message: b.failure}}}
	}
}

// getOpenAIBatch is GET /v1/batches/{id}.
func (s *Server) getOpenAIBatch(w http.ResponseWriter, r *http.Request) {
	s.openAIBatchAction(w, r, func(*batch, time.Time) string { return "" })
}

// cancelOpenAIBatch is POST /v1/batches/{id}/cancel: the batch is
// "cancelling" until its next read, then "cancelled".
func (s *Server) cancelOpenAIBatch(w http.ResponseWriter, r *http.Request) {
	s.openAIBatchAction(w, r, func(b *batch, now time.Time) string {
		switch b.state {
		case batchRunning:
			b.state, b.cancelAt = batchCancelling, now
		case batchCancelling:
		default:
			return fmt.Sprintf("Cannot cancel a batch with status '%s'.", openAIStatus[b.state])
		}
		return ""
	})
}

// openAIBatchAction runs act on the batch named by the path, then answers
// with the batch, or with 409 and what act refused.
func (s *Server) openAIBatchAction(w http.ResponseWriter, r *http.Request, act func(*batch, time.Time) (refused string)) {
	id := r.PathValue("id")
	var (
		view    openAIBatchJSON
		found   bool
		refused string
	)
	s.withBatches(func(now time.Time) []BatchRequest {
		b := s.findLocked(openAI, id)
		if found = b != nil; found {
			if refused = act(b, now); refused == "" {
				view = openAIView(b, false)
			}
		}
		return nil
	})
	switch {
	case !found:
		openAINotFound(w, "batch", id)
	case refused != "":
		openAIFail(w, http.StatusConflict, refused)
	default:
		writeJSON(w, http.StatusOK, view)
	}
}

// listOpenAIBatches is GET /v1/batches?after=&limit=, newest first.
func (s *Server) listOpenAIBatches(w http.ResponseWriter, r *http.Request) {
	limit, err := listLimit(r, 20, 100)
	if err != nil {
		openAIFail(w, http.StatusBadRequest, err.Error())
		return
	}
	var out struct {
		Object  string            `json:"object"`
		Data    []openAIBatchJSON `json:"data"`
		FirstID *string           `json:"first_id"`
		LastID  *string           `json:"last_id"`
		HasMore bool              `json:"has_more"`
	}
	out.Object, out.Data = "list", []openAIBatchJSON{}
	s.withBatches(func(time.Time) []BatchRequest {
		var data []*batch
		data, out.HasMore = page(s.newestLocked(openAI), r.URL.Query().Get("after"), "", limit)
		out.FirstID, out.LastID = pageIDs(data)
		for _, b := range data {
			out.Data = append(out.Data, openAIView(b, false))
		}
		return nil
	})
	writeJSON(w, http.StatusOK, out)
}

// openAIResultLine is one line of an output or error file.
type openAIResultLine struct {
	ID       string                `json:"id"`
	CustomID string                `json:"custom_id"`
	Response *openAIResultResponse `json:"response"`
	Error    *openAIResultError    `json:"error"`
}

type openAIResultResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type openAIResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeResultFilesLocked writes an ended batch's output file (the answers
// with 200) and error file (those with 4xx or 5xx, and the requests that
// expired or were cancelled). An empty file is not written: its id stays
// null, as OpenAI leaves it.
func (s *Server) writeResultFilesLocked(b *batch, now time.Time) {
	var out, errs bytes.Buffer
	outEnc, errEnc := json.NewEncoder(&out), json.NewEncoder(&errs)
	for i, r := range b.results {
		line := openAIResultLine{ID: "batch_req_" + r.id, CustomID: b.items[i].customID}
		enc := errEnc
		switch r.kind {
		case resultExpired:
			line.Error = &openAIResultError{Code: "batch_expired", Message: "This request could not be executed before the completion window expired."}
		case resultCanceled:
			line.Error = &openAIResultError{Code: "batch_cancelled", Message: "This request was not executed because the batch was cancelled."}
		default:
			line.Response = &openAIResultResponse{StatusCode: r.status, RequestID: "req_" + r.id, Body: r.body}
			if r.status == http.StatusOK {
				enc = outEnc
			}
		}
		if err := enc.Encode(line); err != nil { // raw JSON the fake wrote itself always encodes
			panic(fmt.Sprintf("fakeprovider: encoding a result line: %v", err))
		}
	}
	b.outputFile = s.addResultFileLocked(b, "output", out.Bytes(), now)
	b.errorFile = s.addResultFileLocked(b, "error", errs.Bytes(), now)
}

func (s *Server) addResultFileLocked(b *batch, kind string, content []byte, now time.Time) string {
	if len(content) == 0 {
		return ""
	}
	f := &file{id: s.batches.nextID("file-"), name: b.id + "_" + kind + ".jsonl", purpose: "batch_output", size: int64(len(content)), created: now, content: content}
	s.batches.files[f.id] = f
	return f.id
}
