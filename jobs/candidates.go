package jobs

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed candidates.sql
var candidatesSQL string

// CandidateStatsParams asks what each route candidate did since Since.
type CandidateStatsParams struct {
	// Since is where the window starts: the attempts that started at or
	// after it are counted. Required.
	Since time.Time
	// Tenant narrows the counts to one tenant's jobs; empty counts every
	// tenant's.
	Tenant string
	// Limit is how many (candidate, model) rows to return, the busiest
	// first: 1 to MaxListLimit, default 100.
	Limit int
}

// CandidateStats is what one route candidate (lease.Route) did with one
// model over a window, from the attempts' route columns (see the package
// doc's "Model routes").
type CandidateStats struct {
	Candidate string `json:"candidate"`
	Model     string `json:"model,omitempty"`
	// Attempts ended on the candidate: it made their last call
	// (Attempt.Candidate). Succeeded, Failed and Snoozed split them by
	// outcome: Failed is every outcome other than succeeded and snoozed
	// (a retry, a failure, a review, a lost lease, ...).
	Attempts  int64 `json:"attempts"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Snoozed   int64 `json:"snoozed"`
	// MovedFrom counts the candidate's calls that failed and moved on to
	// the next candidate (Attempt.Moves), and MovedFromByFailure splits
	// them by failure class (Move.Failure: "rate_limited", "timeout", ...).
	MovedFrom          int64            `json:"moved_from"`
	MovedFromByFailure map[string]int64 `json:"moved_from_by_failure,omitempty"`
	// InputTokens and OutputTokens are the usage of the attempts that
	// ended on the candidate, as recorded (Attempt.Usage): the calls they
	// moved on from included, since an attempt's usage counts every call
	// it made.
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// dest is a CandidateStats row as scanned.
func (c *CandidateStats) dest() []any {
	return []any{&c.Candidate, &c.Model, &c.Attempts, &c.Succeeded, &c.Failed, &c.Snoozed,
		&c.MovedFrom, &c.MovedFromByFailure, &c.InputTokens, &c.OutputTokens}
}

// CandidateStats returns, per route candidate and model, the attempts
// started since p.Since that ended on it, by outcome, with their usage,
// and its calls that failed and moved on, by failure class: the busiest
// first, at most p.Limit rows. A candidate that only ever moved on has
// zero attempts; one that only ever served, no moves. It is an operator's
// read, not tenant-scoped unless p.Tenant says so, and it reads the
// attempts table sequentially (no index serves a time window; see
// candidates.sql): call it now and then, not per request.
func (s *PostgresStore) CandidateStats(ctx context.Context, db DBTX, p CandidateStatsParams) ([]CandidateStats, error) {
	fail := func(field, problem string) ([]CandidateStats, error) {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	if p.Since.IsZero() {
		return fail("Since", "is required: the start of the window")
	}
	if problem := checkText(p.Tenant, false, MaxTenantLen); problem != "" {
		return fail("Tenant", problem)
	}
	limit := cmp.Or(p.Limit, defaultListLimit)
	if limit < 1 || limit > MaxListLimit {
		return fail("Limit", fmt.Sprintf("is %d; use 1 to %d, or 0 for %d", p.Limit, MaxListLimit, defaultListLimit))
	}
	rows, err := db.Query(ctx, s.sql.candidateStats, p.Since, dbsql.NullIfZero(p.Tenant), limit)
	if err != nil {
		return nil, fmt.Errorf("jobs: candidate stats: %w", s.explain(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (CandidateStats, error) {
		var c CandidateStats
		if err := row.Scan(c.dest()...); err != nil {
			return c, err
		}
		if len(c.MovedFromByFailure) == 0 {
			c.MovedFromByFailure = nil
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: candidate stats: %w", s.explain(err))
	}
	return out, nil
}
