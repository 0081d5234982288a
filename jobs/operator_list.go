package jobs

import (
	"context"
	_ "embed"
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
	page, err := newListPage(params.States, params.Limit, params.Cursor, "ListAll")
	if err != nil {
		return nil, err
	}
	return s.fetchPage(ctx, db, "list all", s.sql.listAll, page, page.states, params.Kind)
}
