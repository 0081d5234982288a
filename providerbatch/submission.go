package providerbatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

// Submission is one provider batch as llmq recorded it.
type Submission struct {
	ID       uuid.UUID `json:"id"`
	Pool     string    `json:"pool"`
	Provider string    `json:"provider"`
	Model    string    `json:"model"`
	Queue    string    `json:"queue"`
	// State is "preparing" (recorded; the provider may not hold it yet),
	// "submitted" (the provider holds it; polled) or "ended" (every
	// request's job settled).
	State string `json:"state"`
	// ProviderBatchID and ProviderStatus are the provider's id for the
	// batch and its status as last polled.
	ProviderBatchID string `json:"provider_batch_id,omitempty"`
	ProviderStatus  string `json:"provider_status,omitempty"`
	Requests        int    `json:"requests"`
	Bytes           int64  `json:"bytes"`
	EstimatedTokens int64  `json:"estimated_tokens"`
	// Succeeded, Failed, Stale, Returned and Skipped count its requests as
	// settled so far: applied as SUCCEEDED; applied as any other outcome;
	// not applied because the job no longer waited on it (cancelled);
	// returned to waiting without a result (the batch expired or was
	// cancelled); result lines that could not be read.
	Succeeded       int       `json:"succeeded"`
	Failed          int       `json:"failed"`
	Stale           int       `json:"stale"`
	Returned        int       `json:"returned"`
	Skipped         int       `json:"skipped"`
	CancelRequested bool      `json:"cancel_requested"`
	Polls           int       `json:"polls"`
	LastError       string    `json:"last_error,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	SubmittedAt     time.Time `json:"submitted_at,omitzero"`
	EndedAt         time.Time `json:"ended_at,omitzero"`
}

// submissionRow is a ListSubmissions row as scanned.
type submissionRow struct {
	s                Submission
	submitted, ended *time.Time
}

func (r *submissionRow) dest() []any {
	s := &r.s
	return []any{(*[16]byte)(&s.ID), &s.Pool, &s.Provider, &s.Model, &s.Queue, &s.State, &s.ProviderBatchID, &s.ProviderStatus,
		&s.Requests, &s.Bytes, &s.EstimatedTokens, &s.Succeeded, &s.Failed, &s.Stale, &s.Returned, &s.Skipped,
		&s.CancelRequested, &s.Polls, &s.LastError, &s.CreatedAt, &r.submitted, &r.ended}
}

func (r *submissionRow) submission() Submission {
	if r.submitted != nil {
		r.s.SubmittedAt = *r.submitted
	}
	if r.ended != nil {
		r.s.EndedAt = *r.ended
	}
	return r.s
}

// MaxListLimit bounds List's limit.
const MaxListLimit = 1000

// Operator reads and cancels submissions: what llmq batches and the
// console use. Its zero value is not usable; see NewOperator.
type Operator struct {
	sql statements
}

// NewOperator returns an Operator on the llmq tables of schema ("" for
// "llmq").
func NewOperator(schema string) (*Operator, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("providerbatch: %w", err)
	}
	o := &Operator{}
	if _, err := o.sql.load(s); err != nil {
		return nil, fmt.Errorf("providerbatch: %w", err)
	}
	return o, nil
}

// List returns up to limit submissions of pool ("" for every pool),
// newest first.
func (o *Operator) List(ctx context.Context, db jobs.DBTX, pool string, limit int) ([]Submission, error) {
	if limit < 1 || limit > MaxListLimit {
		return nil, fmt.Errorf("%w: limit is %d; use 1 to %d", ErrInvalidConfig, limit, MaxListLimit)
	}
	rows, err := db.Query(ctx, o.sql.listSubmissions, pool, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("providerbatch: list submissions: %w", err)
	}
	subs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Submission, error) {
		var r submissionRow
		err := row.Scan(r.dest()...)
		return r.submission(), err
	})
	if err != nil {
		return nil, fmt.Errorf("providerbatch: list submissions: %w", err)
	}
	return subs, nil
}

// Cancel asks the submitter of id's pool to cancel the provider batch at
// its next poll; the requests the provider did not answer return to
// waiting. ErrNotFound if no such submission is open.
func (o *Operator) Cancel(ctx context.Context, db jobs.DBTX, id uuid.UUID) error {
	var pool string
	err := db.QueryRow(ctx, o.sql.requestCancel, dbsql.UUID(id)).Scan(&pool)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: no open submission %s", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("providerbatch: cancel submission %s: %w", id, err)
	}
	return nil
}
