package admission

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

//go:embed quotas.sql
var quotasSQL string

var (
	// ErrOverQuota is matched by a *QuotaError with status 429: the tenant
	// has reached one of its acceptance quotas.
	ErrOverQuota = errors.New("admission: tenant over quota")
	// ErrAtCapacity is matched by a *QuotaError with status 503: the
	// system as a whole holds as much pending work as it is configured to.
	ErrAtCapacity = errors.New("admission: system at capacity")
)

// QuotaError refuses an acceptance. Nothing of the refused call was
// written. Status is the HTTP status a server should answer with (429 or
// 503) and RetryAfter its Retry-After.
type QuotaError struct {
	Status     int
	Tenant     string
	Dimension  string // pending_jobs, pending_bytes, pending_tokens, daily_cost or system_pending_jobs
	Limit      int64
	Current    int64 // with the refused jobs counted
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%v: tenant %q: %s would be %d, the limit is %d; retry after %v",
		e.kind(), e.Tenant, e.Dimension, e.Current, e.Limit, e.RetryAfter)
}

func (e *QuotaError) kind() error {
	if e.Status == http.StatusServiceUnavailable {
		return ErrAtCapacity
	}
	return ErrOverQuota
}

// Unwrap makes errors.Is match ErrOverQuota or ErrAtCapacity.
func (e *QuotaError) Unwrap() error { return e.kind() }

// TenantQuota bounds what one tenant may have accepted and not finished,
// and what it may spend per UTC day. Zero means no limit.
type TenantQuota struct {
	MaxPendingJobs   int64 `json:"max_pending_jobs"`
	MaxPendingBytes  int64 `json:"max_pending_bytes"`  // of payloads
	MaxPendingTokens int64 `json:"max_pending_tokens"` // of estimated tokens
	MaxDailyCost     int64 `json:"max_daily_cost"`     // micro-units, from the usage ledger
}

func (q TenantQuota) validate() error {
	if q.MaxPendingJobs < 0 || q.MaxPendingBytes < 0 || q.MaxPendingTokens < 0 || q.MaxDailyCost < 0 {
		return invalid("TenantQuota", "limits must not be negative (0 means none)")
	}
	return nil
}

// DefaultQuotaRetry is the retry hint of a pending-work refusal when
// QuotaConfig.RetryHint is zero.
const DefaultQuotaRetry = 30 * time.Second

// QuotaConfig configures tenant acceptance quotas.
type QuotaConfig struct {
	// Schema holds the llmq tables. Default "llmq".
	Schema string
	// Default applies to tenants without a quota of their own
	// (SetTenantQuota). Zero: no limits.
	Default TenantQuota
	// SystemMaxPendingJobs bounds the pending jobs of all tenants together;
	// beyond it acceptance fails with 503. Zero: no bound.
	SystemMaxPendingJobs int64
	// RetryHint is the Retry-After of a refusal for pending work (a daily
	// spend refusal waits for the next UTC day). Default 30s.
	RetryHint time.Duration
	// Queues are the queues whose acceptances are checked. Default: all.
	// Leave out the queues of work a host enqueues because other work
	// finished, such as webhook deliveries enqueued in the runner's
	// OnSucceeded: refusing those would fail the success and run the
	// finished (and paid for) job again. Jobs of every queue still count
	// towards a tenant's pending work.
	Queues []string
}

// Quotas checks tenant acceptance quotas inside the enqueue transaction:
// set Hook as jobs.Config.OnAccept.
//
// Pending jobs, bytes and tokens are counted from the jobs table after the
// new jobs are inserted, under a transaction-scoped advisory lock per
// tenant taken before counting, so two concurrent enqueues of one tenant
// are serialised and cannot both pass on the last unit (READ COMMITTED
// takes a fresh snapshot for the count, after the lock). The count reads
// at most the quota's worth of rows. The system-wide bound is counted
// without a lock, so concurrent acceptances may pass it by at most their
// own batches. Daily spend is read from the usage ledger, which lags by
// the calls in flight.
type Quotas struct {
	cfg QuotaConfig
	sql statements
}

// NewQuotas validates cfg.
func NewQuotas(cfg QuotaConfig) (*Quotas, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	var sql statements
	if _, err := sql.load(schema); err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	cfg.Schema = schema.Name()
	if err := cfg.Default.validate(); err != nil {
		return nil, err
	}
	if cfg.SystemMaxPendingJobs < 0 || cfg.RetryHint < 0 {
		return nil, invalid("QuotaConfig", "SystemMaxPendingJobs and RetryHint must not be negative")
	}
	cfg.RetryHint = cmp.Or(cfg.RetryHint, DefaultQuotaRetry)
	return &Quotas{cfg: cfg, sql: sql}, nil
}

// SetTenantQuota gives tenant quotas of its own, effective for the next
// acceptance on every process.
func (q *Quotas) SetTenantQuota(ctx context.Context, db DBTX, tenant string, quota TenantQuota) error {
	if p := validateTenant(tenant); p != nil {
		return p
	}
	if err := quota.validate(); err != nil {
		return err
	}
	_, err := db.Exec(ctx, q.sql.upsertTenantQuota, tenant, nullIfZero(quota.MaxPendingJobs),
		nullIfZero(quota.MaxPendingBytes), nullIfZero(quota.MaxPendingTokens), nullIfZero(quota.MaxDailyCost))
	if err != nil {
		return fmt.Errorf("admission: setting the quota of tenant %q: %w", tenant, err)
	}
	return nil
}

func validateTenant(tenant string) error {
	return (Request{Pool: "-", Tenant: tenant}).Validate()
}

func nullIfZero(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}

// Hook is the jobs.AcceptHook that enforces the quotas.
func (q *Quotas) Hook() jobs.AcceptHook { return q.check }

func (q *Quotas) check(ctx context.Context, tx pgx.Tx, accepted []*jobs.Job) error {
	if len(q.cfg.Queues) > 0 {
		accepted = slices.DeleteFunc(slices.Clone(accepted), func(j *jobs.Job) bool {
			return !slices.Contains(q.cfg.Queues, j.Queue)
		})
		if len(accepted) == 0 {
			return nil
		}
	}
	if q.cfg.SystemMaxPendingJobs > 0 {
		var n int64
		if err := tx.QueryRow(ctx, q.sql.countPendingSystem, q.cfg.SystemMaxPendingJobs+1).Scan(&n); err != nil {
			return fmt.Errorf("admission: counting pending jobs: %w", err)
		}
		if n > q.cfg.SystemMaxPendingJobs {
			return &QuotaError{Status: http.StatusServiceUnavailable, Tenant: accepted[0].Tenant, Dimension: "system_pending_jobs",
				Limit: q.cfg.SystemMaxPendingJobs, Current: n, RetryAfter: q.cfg.RetryHint}
		}
	}
	tenants := make([]string, 0, 1)
	for _, j := range accepted {
		if !slices.Contains(tenants, j.Tenant) {
			tenants = append(tenants, j.Tenant)
		}
	}
	slices.Sort(tenants) // one lock order for every caller: no deadlocks
	for _, tenant := range tenants {
		if err := q.checkTenant(ctx, tx, tenant); err != nil {
			return err
		}
	}
	return nil
}

func (q *Quotas) checkTenant(ctx context.Context, tx pgx.Tx, tenant string) error {
	quota := q.cfg.Default
	var own quotaScan
	err := tx.QueryRow(ctx, q.sql.lockTenantQuota, q.cfg.Schema, tenant).Scan(own.lockDest()...)
	if err != nil {
		return fmt.Errorf("admission: reading the quota of tenant %q: %w", tenant, err)
	}
	if own.own {
		quota = own.quota()
	}
	if quota == (TenantQuota{}) {
		return nil
	}
	// A separate statement after the lock: its snapshot includes every
	// acceptance of this tenant that committed before the lock was ours.
	limit := int64(-1) // no LIMIT
	if quota.MaxPendingJobs > 0 {
		limit = quota.MaxPendingJobs + 1
	}
	var pendingJobs, pendingBytes, pendingTokens, cost int64
	if err := tx.QueryRow(ctx, q.sql.countPendingTenant, tenant, limit).Scan(&pendingJobs, &pendingBytes, &pendingTokens, &cost); err != nil {
		return fmt.Errorf("admission: counting the pending work of tenant %q: %w", tenant, err)
	}
	over := func(dim string, max, current int64, wait time.Duration) error {
		return &QuotaError{Status: http.StatusTooManyRequests, Tenant: tenant, Dimension: dim, Limit: max, Current: current, RetryAfter: wait}
	}
	for _, d := range []struct {
		dim          string
		max, current int64
	}{
		{"pending_jobs", quota.MaxPendingJobs, pendingJobs},
		{"pending_bytes", quota.MaxPendingBytes, pendingBytes},
		{"pending_tokens", quota.MaxPendingTokens, pendingTokens},
	} {
		if d.max > 0 && d.current > d.max {
			return over(d.dim, d.max, d.current, q.cfg.RetryHint)
		}
	}
	if quota.MaxDailyCost > 0 && cost >= quota.MaxDailyCost {
		now := time.Now().UTC()
		return over("daily_cost", quota.MaxDailyCost, cost, utcDay(now).AddDate(0, 0, 1).Sub(now))
	}
	return nil
}
