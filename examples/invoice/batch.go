package invoice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
)

// BatchCompletedEvent is the webhook an upload's tenant receives, once,
// when every extraction of the upload is finished.
const BatchCompletedEvent = "invoice.batch.completed"

// Upload limits: a batch of at most MaxUploadDocuments, in a body of at
// most maxUploadBody bytes (about 150 bytes a document).
const (
	MaxUploadDocuments = 1000
	maxUploadBody      = 256 << 10
)

// BatchRequest is the body of POST /extraction-batches: the documents of
// one upload, each named by version and digest as in CreateRequest, and
// the schema they are all extracted with.
type BatchRequest struct {
	Documents []Document `json:"documents"`
	Schema    string     `json:"schema"`
	// NeededBy is as in CreateRequest, for every document of the upload.
	NeededBy time.Time `json:"needed_by,omitzero"`
}

// BatchView is an upload as the API shows it: its progress, read from the
// batch's own row (one primary-key probe, whatever its size).
type BatchView struct {
	BatchID        uuid.UUID `json:"batch_id"`
	StatusURL      string    `json:"status_url"`
	Done           bool      `json:"done"`
	Total          int       `json:"total"`
	Finished       int       `json:"finished"`
	Succeeded      int       `json:"succeeded"`
	ReviewRequired int       `json:"review_required"`
	Failed         int       `json:"failed"`
	Cancelled      int       `json:"cancelled"`
	// PercentDone is Finished as a whole percentage of Total, rounded
	// down: 100 only when Done.
	PercentDone int       `json:"percent_done"`
	CreatedAt   time.Time `json:"created_at"`
	FinishedAt  time.Time `json:"finished_at,omitzero"`
	// Jobs are the upload's extractions in the order of its documents;
	// only in the answer that accepted it (202).
	Jobs []BatchJob `json:"jobs,omitempty"`
}

// BatchJob is one extraction of an upload.
type BatchJob struct {
	JobID     uuid.UUID `json:"job_id"`
	StatusURL string    `json:"status_url"`
	Document  Document  `json:"document"`
}

func batchView(b *jobs.Batch) BatchView {
	return BatchView{
		BatchID: b.ID, StatusURL: "/extraction-batches/" + b.ID.String(), Done: b.Done(),
		Total: b.Total, Finished: b.Finished, Succeeded: b.Succeeded, ReviewRequired: b.ReviewRequired,
		Failed: b.Failed, Cancelled: b.Cancelled, PercentDone: b.Finished * 100 / max(b.Total, 1),
		CreatedAt: b.CreatedAt, FinishedAt: b.FinishedAt,
	}
}

// createBatch accepts an upload: one extraction per document, all in one
// transaction, idempotent per Idempotency-Key. The first acceptance is
// 202 with Location and the jobs; the same key and documents again are
// 200 with the batch and the same jobs (a client that lost the first
// answer learns them), without the jobs once retention has pruned any of
// them; the same key with other documents is 409.
func (s *Service) createBatch(w http.ResponseWriter, r *http.Request, _ string, c Credential) {
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	if cerr := checkIdempotencyKey(key); cerr != nil {
		refuse(w, cerr)
		return
	}
	req, cerr := decodeBatchRequest(http.MaxBytesReader(w, r.Body, maxUploadBody))
	if cerr != nil {
		refuse(w, cerr)
		return
	}
	queue, deadline, cerr := s.lane("needed_by", req.NeededBy, time.Now())
	if cerr != nil {
		refuse(w, cerr)
		return
	}
	sizes, cerr, err := s.documentSizes(ctx, c.Tenant, req.Documents)
	switch {
	case err != nil:
		s.unavailable(w, r, err)
		return
	case cerr != nil:
		refuse(w, cerr)
		return
	}
	params := jobs.EnqueueBatchParams{Tenant: c.Tenant, Key: key, Jobs: make([]jobs.EnqueueParams, len(req.Documents))}
	for i, d := range req.Documents {
		p := Payload{Document: d, Schema: req.Schema, Policy: PolicyVersion, Model: Model}
		payload, err := json.Marshal(p)
		if err != nil {
			s.internalError(w, r, "internal", err)
			return
		}
		reuse, err := extractionReuse(p, queue)
		if err != nil {
			s.internalError(w, r, "internal", err)
			return
		}
		params.Jobs[i] = jobs.EnqueueParams{
			Kind: Kind, Queue: queue, Payload: payload, DeadlineAt: deadline, Reuse: reuse,
			EstimatedTokens: estimateTokens(sizes[i], s.cfg.MaxTokens),
		}
	}
	res, err := inTx(ctx, s.pool, func(tx pgx.Tx) (jobs.EnqueueBatchResult, error) {
		return s.accept.EnqueueBatch(ctx, tx, params)
	})
	var quota *admission.QuotaError
	switch {
	case errors.Is(err, jobs.ErrBatchConflict):
		writeError(w, http.StatusConflict, "idempotency_conflict", "Idempotency-Key", "the key was used for a different upload")
		return
	case errors.As(err, &quota):
		s.refuseQuota(w, c.Tenant, quota)
		return
	case errors.Is(err, jobs.ErrInvalidParams):
		// Every parameter was checked above or is the service's own.
		s.internalError(w, r, "internal", err)
		return
	case err != nil:
		s.unavailable(w, r, err)
		return
	}
	v := batchView(res.Batch)
	if len(res.Jobs) == len(req.Documents) {
		v.Jobs = make([]BatchJob, len(res.Jobs))
		for i, j := range res.Jobs {
			v.Jobs[i] = BatchJob{JobID: j.ID, StatusURL: "/extraction-jobs/" + j.ID.String(), Document: req.Documents[i]}
		}
	}
	if res.Existing {
		writeJSON(w, http.StatusOK, v) // as for one job: the status URL is in the body
		return
	}
	w.Header().Set("Location", v.StatusURL)
	writeJSON(w, http.StatusAccepted, v)
}

// documentSizes checks that every document of an upload is a version the
// tenant stored, with that digest, and returns each one's size in bytes.
// One round trip for the whole upload.
func (s *Service) documentSizes(ctx context.Context, tenant string, docs []Document) ([]int, *refusal, error) {
	names, versions := make([]string, len(docs)), make([]int, len(docs))
	for i, d := range docs {
		names[i], versions[i] = d.Name, d.Version
	}
	rows, err := s.pool.Query(ctx, s.q["GetDocuments"], tenant, names, versions)
	if err != nil {
		return nil, nil, fmt.Errorf("invoice: reading an upload's documents: %w", err)
	}
	defer rows.Close()
	sizes := make([]int, len(docs))
	digests := make([]string, len(docs))
	found := make([]bool, len(docs))
	for rows.Next() {
		var (
			i      int64
			digest string
			size   int
		)
		if err := rows.Scan(&i, &digest, &size); err != nil {
			return nil, nil, fmt.Errorf("invoice: reading an upload's documents: %w", err)
		}
		sizes[i-1], digests[i-1], found[i-1] = size, digest, true
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("invoice: reading an upload's documents: %w", err)
	}
	for i, d := range docs {
		switch {
		case !found[i]:
			return nil, invalid(fmt.Sprintf("documents[%d].version", i), "no such document version"), nil
		case digests[i] != d.SHA256:
			return nil, invalid(fmt.Sprintf("documents[%d].sha256", i), "does not match the document version's content"), nil
		}
	}
	return sizes, nil, nil
}

func (s *Service) getBatch(w http.ResponseWriter, r *http.Request, _ string, c Credential) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", "", "no such upload")
		return
	}
	b, err := s.Jobs.Batch(r.Context(), s.pool, c.Tenant, id)
	if errors.Is(err, jobs.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "", "no such upload")
		return
	}
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, batchView(b))
}
