package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/llmqtype"
)

// Operator reads. An operator's tools (cmd/llmq) see every tenant; a server
// answering tenants must use the tenant-scoped Store methods instead.

// Lookup returns the job with id whatever its tenant, or ErrNotFound. It is
// for operators; a tenant's request goes through Get.
func (s *PostgresStore) Lookup(ctx context.Context, db DBTX, id uuid.UUID) (*Job, error) {
	rows, err := db.Query(ctx, s.sql.lookup, id)
	if err != nil {
		return nil, fmt.Errorf("jobs: lookup %s: %w", id, s.explain(err))
	}
	job, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: lookup %s: %w", id, s.explain(err))
	}
	return job, nil
}

// DeadLetters returns up to limit (1 to MaxListLimit) FAILED_TERMINAL jobs
// of every tenant, most recently finished first. It reads every job row:
// an operator's query, not a hot path. A tenant's own are listed by List.
func (s *PostgresStore) DeadLetters(ctx context.Context, db DBTX, limit int) ([]*Job, error) {
	if limit < 1 || limit > MaxListLimit {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "limit", Problem: fmt.Sprintf("is %d; use 1 to %d", limit, MaxListLimit)}
	}
	rows, err := db.Query(ctx, s.sql.deadLetters, limit)
	if err != nil {
		return nil, fmt.Errorf("jobs: listing dead letters: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, scanJobs())
	if err != nil {
		return nil, fmt.Errorf("jobs: listing dead letters: %w", err)
	}
	return jobs, nil
}

// TenantBacklog is one tenant's unfinished work in one queue, with the
// limits its claims run under.
type TenantBacklog struct {
	Queue  string `json:"queue"`
	Tenant string `json:"tenant"`
	// Runnable jobs are eligible now; Scheduled ones wait for their
	// AvailableAt (a retry's backoff, a snooze, a delayed start).
	Runnable  int64 `json:"runnable"`
	Scheduled int64 `json:"scheduled"`
	Running   int64 `json:"running"`
	// OldestRunnableAge is how long the tenant's longest-waiting runnable
	// job has been eligible; zero when none is.
	OldestRunnableAge time.Duration `json:"oldest_runnable_age"`
	// Limits apply to the tenant: its own when OwnLimits, else the
	// defaults.
	Limits    TenantLimits `json:"limits"`
	OwnLimits bool         `json:"own_limits"`
}

// TenantBacklogs returns every (queue, tenant) with unfinished jobs, by
// queue then tenant. It reads the unfinished jobs, so its cost grows with
// the backlog: an operator's query, not a hot path.
func (s *PostgresStore) TenantBacklogs(ctx context.Context, db DBTX) ([]TenantBacklog, error) {
	rows, err := db.Query(ctx, s.sql.tenantBacklogs)
	if err != nil {
		return nil, fmt.Errorf("jobs: tenant backlogs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TenantBacklog, error) {
		var r tenantBacklogRow
		err := row.Scan(r.dest()...)
		return r.backlog(), err
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: tenant backlogs: %w", err)
	}
	return out, nil
}

// KindBacklog is one kind's unfinished work in one queue. Runnable work of
// a kind that no runner serves only ages: OldestRunnableAge grows and
// Running stays zero.
type KindBacklog struct {
	Queue     string `json:"queue"`
	Kind      string `json:"kind"`
	Runnable  int64  `json:"runnable"`
	Scheduled int64  `json:"scheduled"`
	Running   int64  `json:"running"`
	// OldestRunnableAge is how long the kind's longest-waiting runnable job
	// has been eligible; zero when none is.
	OldestRunnableAge time.Duration `json:"oldest_runnable_age"`
}

// KindBacklogs returns every (queue, kind) with unfinished jobs, by queue
// then kind. Like TenantBacklogs it reads the unfinished jobs: an
// operator's query, not a hot path.
func (s *PostgresStore) KindBacklogs(ctx context.Context, db DBTX) ([]KindBacklog, error) {
	rows, err := db.Query(ctx, s.sql.kindBacklogs)
	if err != nil {
		return nil, fmt.Errorf("jobs: kind backlogs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KindBacklog, error) {
		var r kindBacklogRow
		err := row.Scan(r.dest()...)
		return r.backlog(), err
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: kind backlogs: %w", err)
	}
	return out, nil
}

// UnservedKind is a kind with runnable jobs that a runner has no handler
// for; see UnservedKinds.
type UnservedKind struct {
	Kind string
	// Runnable counts the jobs seen (at most 1000 per tenant).
	Runnable int64
	// OldestRunnableAge is how long the oldest of them has been eligible.
	OldestRunnableAge time.Duration
}

// UnservedKinds returns the kinds of queue, other than kinds, with jobs
// that have been runnable for at least waited, among the queue's idle
// tenants: where jobs that no claim of those kinds takes end up. A runner
// calls it now and then to warn about work it sees no handler for (see
// queries.sql for its cost and what it cannot see).
func (s *PostgresStore) UnservedKinds(ctx context.Context, db DBTX, queue string, kinds []string, waited time.Duration) ([]UnservedKind, error) {
	if !s.queues[queue] {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "queue", Problem: fmt.Sprintf("%q is not one of the configured queues %q", queue, s.cfg.Queues), Cause: ErrUnknownQueue}
	}
	rows, err := db.Query(ctx, s.sql.unservedKinds, queue, kinds, waited.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("jobs: unserved kinds of %s: %w", queue, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (UnservedKind, error) {
		var (
			k      UnservedKind
			oldest float64
		)
		err := row.Scan(&k.Kind, &k.Runnable, &oldest)
		k.OldestRunnableAge = seconds(oldest)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: unserved kinds of %s: %w", queue, err)
	}
	return out, nil
}

// AllTenantLimits returns every stored limits row by tenant; the empty
// tenant holds the defaults.
func (s *PostgresStore) AllTenantLimits(ctx context.Context, db DBTX) (map[string]TenantLimits, error) {
	rows, err := db.Query(ctx, s.sql.listTenantLimits)
	if err != nil {
		return nil, fmt.Errorf("jobs: listing tenant limits: %w", err)
	}
	defer rows.Close()
	out := map[string]TenantLimits{}
	for rows.Next() {
		var (
			tenant string
			l      TenantLimits
		)
		if err := rows.Scan(tenantLimitsDest(&tenant, &l)...); err != nil {
			return nil, fmt.Errorf("jobs: listing tenant limits: %w", err)
		}
		out[tenant] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("jobs: listing tenant limits: %w", err)
	}
	return out, nil
}
