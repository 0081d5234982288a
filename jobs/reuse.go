package jobs

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed reuse.sql
var reuseSQL string

// Limits and defaults of result reuse.
const (
	// MaxReuseKeyLen bounds Reuse.Key.
	MaxReuseKeyLen = 255
	// DefaultReuseTTL is Reuse.TTL's default: a result computed in the
	// last day is reused.
	DefaultReuseTTL = 24 * time.Hour
	// MaxReuseTTL bounds Reuse.TTL. A result is also reused only while
	// its job is kept (see package retention).
	MaxReuseTTL = 366 * 24 * time.Hour
)

// Reuse opts a job in to taking an answer already paid for instead of
// computing it again. Two jobs whose answers would be the same share a
// Key; the host computes it from everything that determines the answer
// (the model, the prompt's version, a digest of the input), and ReuseKey
// does that canonically. The package doc's "Result reuse" says what a
// reused job records and how coalescing works.
type Reuse struct {
	// Key names the answer. Required, at most MaxReuseKeyLen bytes, no
	// control characters. A key is matched within the job's kind: two
	// kinds never share results, whatever their keys.
	Key string `json:"key"`
	// Shared makes the key one space for every tenant: a job of tenant B
	// may take a result computed for tenant A. Only when the answer
	// depends on nothing private to a tenant (a public document, a fixed
	// prompt). False, the default, keeps each tenant's results its own;
	// shared and tenant keys never match each other.
	Shared bool `json:"shared,omitempty"`
	// TTL is how old a result this job accepts, counted from when that
	// result's job finished. Zero means DefaultReuseTTL; at most
	// MaxReuseTTL.
	TTL time.Duration `json:"ttl"`
}

// ReuseKey returns a key for Reuse.Key: "sha256:" and the hex SHA-256 of
// v's canonical JSON, as RequestHash makes it, so the same inputs give
// the same key however their JSON was written. Put in v what determines
// the answer and nothing else: the model and its parameters, the prompt's
// version (a new version is a new key, so results of the old prompt are
// never reused for it), and a digest of the input, not the input itself.
func ReuseKey(v any) (string, error) {
	key, err := canonicalHash(v)
	if err != nil {
		return "", fmt.Errorf("jobs: reuse key: %w", err)
	}
	return key, nil
}

// normalizeReuse checks r and fills in its default TTL; nil stays nil.
// The problem it returns names the field below Reuse.
func normalizeReuse(r *Reuse) (*Reuse, string, string) {
	if r == nil {
		return nil, "", ""
	}
	out := *r
	if problem := checkText(out.Key, true, MaxReuseKeyLen); problem != "" {
		return nil, "Reuse.Key", problem
	}
	switch {
	case out.TTL == 0:
		out.TTL = DefaultReuseTTL
	case out.TTL < 0 || out.TTL > MaxReuseTTL:
		return nil, "Reuse.TTL", fmt.Sprintf("is %s; use a positive duration up to %s, or 0 for the default of %s",
			out.TTL, MaxReuseTTL, DefaultReuseTTL)
	case out.TTL < time.Millisecond:
		return nil, "Reuse.TTL", fmt.Sprintf("is %s; the smallest is 1ms", out.TTL)
	}
	return &out, "", ""
}

// InvalidateReuseParams says which results are never to be reused again:
// those of Kind (required), of Key (every key of the kind when empty),
// computed by jobs of Tenant (every tenant's when empty).
type InvalidateReuseParams struct {
	Kind   string
	Key    string
	Tenant string
	// By and Reason record who invalidated and why. Required.
	By     string
	Reason string
}

// ReuseInvalidation is an invalidation as recorded: every result it
// covers whose attempt started at or before At is never reused again.
type ReuseInvalidation struct {
	ID     int64     `json:"id"`
	Kind   string    `json:"kind"`
	Key    string    `json:"key,omitempty"`    // empty: every key of the kind
	Tenant string    `json:"tenant,omitempty"` // empty: every tenant's results
	At     time.Time `json:"at"`
	By     string    `json:"by"`
	Reason string    `json:"reason"`
}

// InvalidateReuse records an invalidation and returns it, with how many
// results it covers that were reusable a moment ago (within the longest
// TTL, MaxReuseTTL). It is an operator's action, not tenant-scoped: an
// empty Tenant covers every tenant. Cheap whatever it covers: it writes
// one row and changes no job, so the results stay as they were, and
// explainable; no later claim reuses them.
func (s *PostgresStore) InvalidateReuse(ctx context.Context, db DBTX, p InvalidateReuseParams) (ReuseInvalidation, int64, error) {
	fail := func(field, problem string) (ReuseInvalidation, int64, error) {
		return ReuseInvalidation{}, 0, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	if problem := kindProblem(p.Kind); problem != "" {
		return fail("Kind", problem)
	}
	if problem := checkText(p.Key, false, MaxReuseKeyLen); problem != "" {
		return fail("Key", problem)
	}
	if problem := checkText(p.Tenant, false, MaxTenantLen); problem != "" {
		return fail("Tenant", problem)
	}
	if problem := checkText(p.By, true, MaxTenantLen); problem != "" {
		return fail("By", problem)
	}
	if problem := checkText(p.Reason, true, 1000); problem != "" {
		return fail("Reason", problem)
	}
	rows, err := db.Query(ctx, s.sql.invalidateReuse, p.Kind, dbsql.NullIfZero(p.Key), dbsql.NullIfZero(p.Tenant),
		p.By, p.Reason, MaxReuseTTL.Milliseconds())
	if err != nil {
		return ReuseInvalidation{}, 0, fmt.Errorf("jobs: invalidate reuse of kind %q: %w", p.Kind, s.explain(err))
	}
	var covered int64
	inv, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (ReuseInvalidation, error) {
		var r invalidationRow
		err := row.Scan(append(r.dest(), &covered)...)
		return r.invalidation(), err
	})
	if err != nil {
		return ReuseInvalidation{}, 0, fmt.Errorf("jobs: invalidate reuse of kind %q: %w", p.Kind, s.explain(err))
	}
	return inv, covered, nil
}

// ReuseInvalidations returns up to limit (1 to MaxListLimit)
// invalidations, newest first; kind filters when not empty.
func (s *PostgresStore) ReuseInvalidations(ctx context.Context, db DBTX, kind string, limit int) ([]ReuseInvalidation, error) {
	if limit < 1 || limit > MaxListLimit {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "limit", Problem: fmt.Sprintf("is %d; use 1 to %d", limit, MaxListLimit)}
	}
	rows, err := db.Query(ctx, s.sql.listInvalidations, dbsql.NullIfZero(kind), limit)
	if err != nil {
		return nil, fmt.Errorf("jobs: listing reuse invalidations: %w", s.explain(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReuseInvalidation, error) {
		var r invalidationRow
		err := row.Scan(r.dest()...)
		return r.invalidation(), err
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: listing reuse invalidations: %w", s.explain(err))
	}
	return out, nil
}

// invalidationRow is a job_reuse_invalidations row as scanned.
type invalidationRow struct {
	inv         ReuseInvalidation
	key, tenant *string
}

func (r *invalidationRow) dest() []any {
	i := &r.inv
	return []any{&i.ID, &i.Kind, &r.key, &r.tenant, &i.At, &i.By, &i.Reason}
}

func (r *invalidationRow) invalidation() ReuseInvalidation {
	i := r.inv
	i.Key, i.Tenant = dbsql.Deref(r.key), dbsql.Deref(r.tenant)
	return i
}
