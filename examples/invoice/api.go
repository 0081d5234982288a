package invoice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// Model is the model policy the service asks the provider for; it is part of
// the request hash, since another model is another result.
const Model = "extract-small"

// SchemaV1 is the extraction schema the API accepts.
const SchemaV1 = "invoice-v1"

// Handler returns the HTTP API:
//
//	PUT  /documents/{name}            store a document version (OCR text)
//	POST /extraction-jobs             accept an extraction (Idempotency-Key)
//	GET  /extraction-jobs             the tenant's jobs, newest first (a snapshot)
//	GET  /extraction-jobs/{id}        one job, authoritative
//	GET  /extraction-jobs/events      server-sent "job changed" and upload events
//	POST /extraction-batches          accept an upload of documents (Idempotency-Key)
//	GET  /extraction-batches/{id}     an upload's progress
//
// Acceptance answers 202 with Location for a new job or upload and 200
// when the same key and request arrive again (it already exists).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /documents/{name}", s.authed(s.putDocument))
	mux.HandleFunc("POST /extraction-jobs", s.authed(s.createJob))
	mux.HandleFunc("POST /extraction-batches", s.authed(s.createBatch))
	mux.HandleFunc("GET /extraction-batches/{id}", s.authed(s.getBatch))
	mux.HandleFunc("GET /extraction-jobs", s.authed(s.listJobs))
	mux.HandleFunc("GET /extraction-jobs/events", s.authed(s.events))
	mux.HandleFunc("GET /extraction-jobs/{id}", s.authed(s.getJob))
	return mux
}

type authedFunc func(w http.ResponseWriter, r *http.Request, token string, c Credential)

func (s *Service) authed(h authedFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		c, known := s.cfg.Auth.Lookup(token)
		if !ok || !known {
			w.Header().Set("WWW-Authenticate", `Bearer realm="invoice"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "Authorization", "a valid bearer token is required")
			return
		}
		h(w, r, token, c)
	}
}

// apiError is the JSON error body: a code, the field at fault (when one is)
// and a message.
type apiError struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, field, msg string) {
	writeJSON(w, status, map[string]apiError{"error": {Code: code, Field: field, Message: msg}})
}

// refuse answers a client error.
func refuse(w http.ResponseWriter, e *refusal) {
	writeError(w, e.status, e.code, e.field, e.message)
}

// unavailable answers 503 with Retry-After for a failure of the service's
// own (the database, most often) and logs its cause: the client is told to
// retry, the operator what went wrong.
func (s *Service) unavailable(w http.ResponseWriter, r *http.Request, cause error) {
	s.cfg.Logger.Error("invoice API: answering 503", "method", r.Method, "path", r.URL.Path, "err", cause)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "unavailable", "", "try again")
}

// internalError answers 500 for a request the service cannot serve and
// retrying will not help, and logs its cause.
func (s *Service) internalError(w http.ResponseWriter, r *http.Request, code string, cause error) {
	s.cfg.Logger.Error("invoice API: answering 500", "method", r.Method, "path", r.URL.Path, "err", cause)
	writeError(w, http.StatusInternalServerError, code, "", "the service cannot answer this request")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Service) putDocument(w http.ResponseWriter, r *http.Request, _ string, c Credential) {
	name := r.PathValue("name")
	if cerr := checkName("name", name); cerr != nil {
		refuse(w, cerr)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDocumentText))
	switch {
	case tooLarge(err):
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", "body", fmt.Sprintf("at most %d bytes", maxDocumentText))
		return
	case err != nil:
		// The client stopped sending (or was too slow for the server's
		// read timeout): nothing to store, and nobody to answer.
		writeError(w, http.StatusBadRequest, "incomplete", "body", "the body could not be read to its end")
		return
	}
	if cerr := checkDocumentText(body); cerr != nil {
		refuse(w, cerr)
		return
	}
	doc, err := s.PutDocument(r.Context(), c.Tenant, name, string(body))
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, doc)
}

// CreateRequest is the body of POST /extraction-jobs. The document is named
// by its immutable version and content digest; a signed URL is not an
// identity.
type CreateRequest struct {
	Document Document `json:"document"`
	Schema   string   `json:"schema"`
	// NeededBy is the latest time the extraction is needed, if any: its
	// job's deadline. At least BatchLead ahead, with the service's batch
	// lane on, the document goes through the provider's batch API at half
	// price.
	NeededBy time.Time `json:"needed_by,omitzero"`
}

// Payload is what a job carries: ids and options, never the document.
type Payload struct {
	Document Document `json:"document"`
	Schema   string   `json:"schema"`
	Policy   string   `json:"policy"`
	Model    string   `json:"model"`
}

// JobView is a job as the API shows it.
type JobView struct {
	JobID        uuid.UUID       `json:"job_id"`
	State        jobs.State      `json:"state"`
	StateVersion int64           `json:"state_version"`
	StatusURL    string          `json:"status_url"`
	Document     *Document       `json:"document,omitempty"`
	BatchID      uuid.UUID       `json:"batch_id,omitzero"` // the upload it was accepted in, if any
	Attempt      int             `json:"attempt"`
	Result       json.RawMessage `json:"result,omitempty"`
	ReviewReason string          `json:"review_reason,omitempty"`
	ErrorClass   string          `json:"error_class,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	FinishedAt   time.Time       `json:"finished_at,omitzero"`
	// Attempts and LastError are operational details, for operators only.
	Attempts  []jobs.Attempt `json:"attempts,omitempty"`
	LastError string         `json:"last_error,omitempty"`
}

func view(j *jobs.Job) JobView {
	v := JobView{
		JobID: j.ID, State: j.State, StateVersion: j.StateVersion, StatusURL: "/extraction-jobs/" + j.ID.String(),
		BatchID: j.BatchID, Attempt: j.Attempt, CreatedAt: j.CreatedAt, FinishedAt: j.FinishedAt,
	}
	var p Payload
	if json.Unmarshal(j.Payload, &p) == nil {
		v.Document = &p.Document
	}
	switch j.State {
	case jobs.StateSucceeded:
		v.Result = j.Result
	case jobs.StateReviewRequired:
		v.Result, v.ReviewReason = j.Result, j.LastError
	case jobs.StateFailedTerminal:
		v.ErrorClass = j.ErrorClass
	}
	return v
}

func (s *Service) createJob(w http.ResponseWriter, r *http.Request, _ string, c Credential) {
	// The acceptance span: the job's attempts, events and webhook delivery
	// continue its trace, which continues the caller's when it sent one.
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.cfg.TracerProvider.Tracer("github.com/llmq/llmq/examples/invoice").Start(ctx, "POST /extraction-jobs",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.String("llmq.tenant", c.Tenant)))
	defer span.End()
	key := r.Header.Get("Idempotency-Key")
	if cerr := checkIdempotencyKey(key); cerr != nil {
		refuse(w, cerr)
		return
	}
	req, cerr := decodeCreateRequest(http.MaxBytesReader(w, r.Body, maxCreateBody))
	if cerr != nil {
		refuse(w, cerr)
		return
	}
	queue, deadline, cerr := s.lane("needed_by", req.NeededBy, time.Now())
	if cerr != nil {
		refuse(w, cerr)
		return
	}
	text, err := s.document(ctx, c.Tenant, req.Document)
	switch {
	case errors.Is(err, errNoDocument):
		writeError(w, http.StatusUnprocessableEntity, "invalid", "document.version", "no such document version")
		return
	case errors.Is(err, errDigestMismatch):
		writeError(w, http.StatusUnprocessableEntity, "invalid", "document.sha256", "does not match the document version's content")
		return
	case err != nil:
		s.unavailable(w, r, err)
		return
	}
	p := Payload{Document: req.Document, Schema: req.Schema, Policy: PolicyVersion, Model: Model}
	payload, err := json.Marshal(p)
	if err != nil {
		s.internalError(w, r, "internal", err)
		return
	}
	// What changes the result: content, version, schema, policy, model;
	// not the document's name.
	hash, err := jobs.RequestHash(map[string]any{
		"sha256": p.Document.SHA256, "version": p.Document.Version, "schema": p.Schema, "policy": p.Policy, "model": p.Model,
	})
	if err != nil {
		s.internalError(w, r, "internal", err)
		return
	}
	reuse, err := extractionReuse(p, queue)
	if err != nil {
		s.internalError(w, r, "internal", err)
		return
	}
	res, err := inTx(ctx, s.pool, func(tx pgx.Tx) (jobs.EnqueueResult, error) {
		return s.accept.Enqueue(ctx, tx, jobs.EnqueueParams{
			Tenant: c.Tenant, Kind: Kind, Queue: queue, Payload: payload, DeadlineAt: deadline,
			IdempotencyKey: key, RequestHash: hash, Reuse: reuse,
			EstimatedTokens: estimateTokens(len(text), s.cfg.MaxTokens),
		})
	})
	var quota *admission.QuotaError
	var conflict *jobs.ConflictError
	var bad *llmqtype.ValidationError
	switch {
	case errors.As(err, &conflict):
		writeError(w, http.StatusConflict, "idempotency_conflict", "Idempotency-Key", "the key was used for a different request")
		return
	case errors.As(err, &quota):
		s.refuseQuota(w, c.Tenant, quota)
		return
	case errors.As(err, &bad) && bad.Field == "IdempotencyKey":
		// checkIdempotencyKey keeps the job store's rules; this is the
		// store's word should they ever differ.
		writeError(w, http.StatusUnprocessableEntity, "invalid", "Idempotency-Key", bad.Problem)
		return
	case errors.Is(err, jobs.ErrInvalidParams):
		// Every other parameter is the service's own, or its
		// configuration's (the tenant of a token): not the client's fault.
		s.internalError(w, r, "internal", err)
		return
	case err != nil:
		s.unavailable(w, r, err)
		return
	}
	v := view(res.Job)
	if res.Existing {
		writeJSON(w, http.StatusOK, v)
		return
	}
	w.Header().Set("Location", v.StatusURL)
	writeJSON(w, http.StatusAccepted, v)
}

// refuseQuota answers an acceptance the quotas refused: 429 over the
// tenant's own, 503 (logged) at the system's capacity, each with
// Retry-After.
func (s *Service) refuseQuota(w http.ResponseWriter, tenant string, quota *admission.QuotaError) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(quota.RetryAfter.Seconds())))))
	code := "tenant_quota"
	if quota.Status >= http.StatusInternalServerError {
		code = "capacity"
		s.cfg.Logger.Warn("invoice API: answering "+strconv.Itoa(quota.Status)+": system at capacity", "tenant", tenant, "err", quota)
	}
	writeError(w, quota.Status, code, "", quota.Error())
}

// inTx runs fn in a transaction of its own and commits what it wrote. A
// host would add its own writes (an upload record, an audit row) there.
func inTx[T any](ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) (T, error)) (T, error) {
	var res T
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = fn(tx)
		return err
	})
	return res, err
}

// estimateTokens is the reservation of one call: a document of textBytes
// at about four bytes a token, the instructions, and the output budget.
func estimateTokens(textBytes, maxOut int) int64 {
	return int64(textBytes/4+len(systemPrompt)/4+16) + int64(maxOut)
}

func (s *Service) getJob(w http.ResponseWriter, r *http.Request, _ string, c Credential) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", "", "no such job")
		return
	}
	j, err := s.Jobs.Get(r.Context(), s.pool, c.Tenant, id)
	if errors.Is(err, jobs.ErrNotFound) || err == nil && j.Kind != Kind {
		writeError(w, http.StatusNotFound, "not_found", "", "no such job")
		return
	}
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	v := view(j)
	if c.Operator {
		if v.Attempts, err = s.Jobs.Attempts(r.Context(), s.pool, c.Tenant, id); err != nil {
			s.unavailable(w, r, err)
			return
		}
		v.LastError, v.ErrorClass = j.LastError, j.ErrorClass
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Service) listJobs(w http.ResponseWriter, r *http.Request, _ string, c Credential) {
	res, err := s.Jobs.List(r.Context(), s.pool, jobs.ListParams{Tenant: c.Tenant, Kind: Kind, Cursor: r.URL.Query().Get("cursor")})
	if errors.Is(err, jobs.ErrInvalidParams) {
		writeError(w, http.StatusUnprocessableEntity, "invalid", "cursor", err.Error())
		return
	}
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	out := struct {
		Jobs       []JobView `json:"jobs"`
		NextCursor string    `json:"next_cursor,omitempty"`
	}{Jobs: []JobView{}, NextCursor: res.NextCursor}
	for _, j := range res.Jobs {
		out.Jobs = append(out.Jobs, view(j))
	}
	writeJSON(w, http.StatusOK, out)
}

// BatchLead is how far ahead needed_by must be for the batch lane: the
// providers' 24-hour completion window, plus an hour for the submitter to
// gather the document and read the results.
const BatchLead = 25 * time.Hour

// lane is the queue and deadline of a document needed by neededBy (zero:
// no deadline), refused when it is not after now: the batch queue when
// the batch lane is on and the deadline leaves the batch window, else the
// synchronous queue.
func (s *Service) lane(field string, neededBy, now time.Time) (string, time.Time, *refusal) {
	switch {
	case neededBy.IsZero():
		return Queue, time.Time{}, nil
	case !neededBy.After(now.Add(time.Minute)):
		return "", time.Time{}, invalid(field, "must be more than a minute from now")
	case s.cfg.BatchLane && !neededBy.Before(now.Add(BatchLead)):
		return BatchQueue, neededBy, nil
	}
	return Queue, neededBy, nil
}
