package jobs

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed steps.sql
var stepsSQL string

// Limits on a durable step.
const (
	MaxStepNameLen     = 200
	MaxStepOutputBytes = 1 << 20 // a step's output is kept in its job's history: store large outputs elsewhere and keep a reference
)

// Step is a durable step of a job (lease.Step): what one step of its
// handler returned, stored by the attempt that ran it and taken by later
// attempts instead of running the step again.
type Step struct {
	JobID uuid.UUID `json:"job_id"`
	Name  string    `json:"name"`
	// Attempt is the attempt that ran the step and stored its output.
	Attempt int             `json:"attempt"`
	Output  json.RawMessage `json:"output"`
	// Usage is what the step recorded with lease.RecordUsage while it ran:
	// the tokens paid for it, once.
	Usage Usage `json:"usage"`
	// ReusedBy are the later attempts that took Output instead of running
	// the step, in the order they did.
	ReusedBy  []int     `json:"reused_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Candidate is the route candidate (lease.Route) whose call produced
	// Output; empty for a step run outside a route.
	Candidate string `json:"candidate,omitempty"`
}

// StepParams names a step of the attempt holding Lease.
type StepParams struct {
	Lease Lease
	Name  string
}

// SaveStepParams is a step's outcome, to be stored for the attempt holding
// Lease.
type SaveStepParams struct {
	Lease  Lease
	Name   string
	Output json.RawMessage // one JSON value jsonb can hold, at most MaxStepOutputBytes
	Usage  Usage           // Uncertain is not kept: a stored step was answered
	// Candidate is the route candidate whose call produced the output;
	// empty outside a route. At most MaxCandidateLen bytes, without
	// control characters.
	Candidate string
}

// TakeStep returns step p.Name of the job, as an earlier attempt (or this
// one) stored it, for the attempt holding p.Lease; found is false when no
// attempt has stored it yet. A later attempt taking an earlier one's output
// is recorded in the step's ReusedBy. It returns ErrLeaseLost, and nothing
// else, when p.Lease is no longer the job's current attempt: a stale
// attempt neither takes a step nor runs one.
func (s *PostgresStore) TakeStep(ctx context.Context, db DBTX, p StepParams) (step Step, found bool, err error) {
	if err := checkStepName(p.Name); err != nil {
		return Step{}, false, err
	}
	step, found, err = s.stepRow(db.QueryRow(ctx, s.sql.takeStep, p.Lease.JobID, p.Lease.Fence, p.Name), p.Lease.JobID, p.Name)
	if err != nil {
		return Step{}, false, fmt.Errorf("jobs: taking step %q of job %s: %w", p.Name, p.Lease.JobID, err)
	}
	return step, found, nil
}

// SaveStep stores a step's output for the attempt holding p.Lease and
// returns the stored step. Only the first store of a name counts: if the
// same attempt stored the name first (the step ran twice at once), that
// output is returned and p's is discarded. It returns ErrLeaseLost, storing
// nothing, when p.Lease is no longer the job's current attempt, and a
// *llmqtype.ValidationError (naming the field, before anything is written)
// for an empty or overlong name, an output jsonb cannot hold, negative
// usage or a Candidate that is overlong or holds a control character.
func (s *PostgresStore) SaveStep(ctx context.Context, db DBTX, p SaveStepParams) (Step, error) {
	if err := checkStepName(p.Name); err != nil {
		return Step{}, err
	}
	if problem, tooLarge := validate.JSON(p.Output, MaxStepOutputBytes); problem != "" {
		var cause error
		if tooLarge {
			cause = ErrPayloadTooLarge
		}
		return Step{}, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Output", Problem: problem, Cause: cause}
	}
	if p.Usage.InputTokens < 0 || p.Usage.OutputTokens < 0 {
		return Step{}, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Usage", Problem: "token counts must not be negative"}
	}
	if problem := checkText(p.Candidate, false, MaxCandidateLen); problem != "" {
		return Step{}, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Candidate", Problem: problem}
	}
	row := db.QueryRow(ctx, s.sql.saveStep, p.Lease.JobID, p.Lease.Fence, p.Name, string(p.Output),
		p.Usage.InputTokens, p.Usage.OutputTokens, dbsql.NullIfZero(p.Candidate))
	step, found, err := s.stepRow(row, p.Lease.JobID, p.Name)
	if err == nil && !found {
		// Stored by this attempt meanwhile, after the statement's snapshot.
		step, found, err = s.TakeStep(ctx, db, StepParams{Lease: p.Lease, Name: p.Name})
		if err == nil && !found {
			err = errors.New("the step's row conflicted but cannot be read")
		}
	}
	if err != nil {
		return Step{}, fmt.Errorf("jobs: saving step %q of job %s: %w", p.Name, p.Lease.JobID, err)
	}
	return step, nil
}

// stepRow scans a TakeStep or SaveStep row.
func (s *PostgresStore) stepRow(row pgx.Row, id uuid.UUID, name string) (Step, bool, error) {
	var (
		current bool
		r       stepRow
	)
	if err := row.Scan(append([]any{&current}, r.dest()[2:]...)...); err != nil {
		return Step{}, false, s.explain(err)
	}
	if !current {
		return Step{}, false, ErrLeaseLost
	}
	if r.attempt == nil {
		return Step{}, false, nil
	}
	r.s.JobID, r.s.Name = id, name
	return r.step(), true, nil
}

// Steps returns the tenant's job's stored steps in the order they were
// stored, or ErrNotFound when the tenant has no such job.
func (s *PostgresStore) Steps(ctx context.Context, db DBTX, tenant string, id uuid.UUID) ([]Step, error) {
	rows, err := db.Query(ctx, s.sql.listSteps, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("jobs: steps of %s: %w", id, s.explain(err))
	}
	steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Step, error) {
		var r stepRow
		err := row.Scan(r.dest()...)
		return r.step(), err
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: steps of %s: %w", id, s.explain(err))
	}
	if len(steps) == 0 {
		if _, err := s.Get(ctx, db, tenant, id); err != nil {
			return nil, err
		}
	}
	return steps, nil
}

func checkStepName(name string) error {
	if problem := validate.Text(name, true, MaxStepNameLen); problem != "" {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Name", Problem: problem}
	}
	return nil
}

// stepRow is a job_steps row as ListSteps scans it; TakeStep and SaveStep
// return the same columns after their own first two (current, no name).
type stepRow struct {
	s                   Step
	attempt             *int
	output              []byte
	inTokens, outTokens *int64
	reusedBy            []int32
	createdAt           *time.Time
	candidate           *string
}

func (r *stepRow) dest() []any {
	return []any{&r.s.JobID, &r.s.Name, &r.attempt, &r.output, &r.inTokens, &r.outTokens, &r.reusedBy, &r.createdAt, &r.candidate}
}

func (r *stepRow) step() Step {
	st := r.s
	if r.attempt != nil {
		st.Attempt = *r.attempt
	}
	st.Output = json.RawMessage(r.output)
	if r.inTokens != nil {
		st.Usage.InputTokens = *r.inTokens
	}
	if r.outTokens != nil {
		st.Usage.OutputTokens = *r.outTokens
	}
	for _, a := range r.reusedBy {
		st.ReusedBy = append(st.ReusedBy, int(a))
	}
	if r.createdAt != nil {
		st.CreatedAt = *r.createdAt
	}
	st.Candidate = dbsql.Deref(r.candidate)
	return st
}
