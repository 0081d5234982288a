package jobs

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

//go:embed operator_list.sql
var operatorListSQL string

// ListAllParams selects jobs across tenants, newest first, for operators.
type ListAllParams struct {
	// Tenant narrows the listing to one tenant; empty means every tenant.
	Tenant string
	// States filters by state; empty means all.
	States []State
	// Kind filters by kind; empty means all.
	Kind string
	// Cursor continues a previous page (ListResult.NextCursor).
	Cursor string
	// Limit is the page size, 1 to MaxListLimit. Default 100.
	Limit int
}

// ListAll returns a page of jobs for an operator: every tenant's, or one
// tenant's when params.Tenant is set (then it is List). Operator reads are
// not tenant-scoped; a server answering tenants uses List.
func (s *PostgresStore) ListAll(ctx context.Context, db DBTX, params ListAllParams) (*ListResult, error) {
	if params.Tenant != "" {
		return s.List(ctx, db, ListParams(params))
	}
	fail := func(field, problem string) error {
		return &ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	states := make([]string, 0, len(params.States))
	for _, st := range params.States {
		if !st.Valid() {
			return nil, fail("States", fmt.Sprintf("%q is not a state", st))
		}
		states = append(states, string(st))
	}
	limit := cmp.Or(params.Limit, defaultListLimit)
	if limit < 1 || limit > MaxListLimit {
		return nil, fail("Limit", fmt.Sprintf("is %d; use 1 to %d", params.Limit, MaxListLimit))
	}
	var after *uuid.UUID
	if params.Cursor != "" {
		id, err := uuid.Parse(params.Cursor)
		if err != nil {
			return nil, fail("Cursor", "is not a cursor returned by ListAll")
		}
		after = &id
	}
	rows, err := db.Query(ctx, s.sql.listAll, states, params.Kind, after, limit+1)
	if err != nil {
		return nil, fmt.Errorf("jobs: list all: %w", s.migrated(err))
	}
	jobs, err := pgx.CollectRows(rows, scanJob)
	if err != nil {
		return nil, fmt.Errorf("jobs: list all: %w", s.migrated(err))
	}
	res := &ListResult{Jobs: jobs}
	if len(jobs) > limit {
		res.Jobs = jobs[:limit]
		res.NextCursor = jobs[limit-1].ID.String()
	}
	return res, nil
}
