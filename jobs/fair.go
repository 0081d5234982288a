package jobs

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

// TenantLimits are a tenant's share of its queues, stored as data: a change
// applies to the next claim, without a restart.
type TenantLimits struct {
	// Weight is the tenant's share relative to other backlogged tenants of
	// a queue: a tenant of weight 2 receives twice the claims of one of
	// weight 1. 1 to MaxTenantWeight.
	Weight int `json:"weight"`
	// MaxRunning caps the tenant's RUNNING jobs in each queue, across all
	// runners; 0 means no cap.
	MaxRunning int `json:"max_running"`
}

// MaxTenantWeight is the largest TenantLimits.Weight.
const MaxTenantWeight = 1000

// tenantCandidate is one tenant a claim locked, with what it needs to share
// out the batch.
type tenantCandidate struct {
	tenant     string
	vtime      float64
	weight     float64
	maxRunning int
	running    int
	// given is how many jobs of the batch it is offered, urgent and, of
	// those, relaxed (the low-priority share).
	given, relaxed int
}

// Claim implements Store. It is one short transaction of two statements:
// LockClaimTenants locks the active tenants with the lowest virtual time,
// the batch is shared out among them by weight (below), and ClaimJobs takes
// each tenant's share under its cap and group order. See queries.sql.
//
// ClaimJobs takes no row lock and waits at most claimLockTimeout for a
// job's row. When that passes, some other session holds a waiting job (a
// cancel does for milliseconds; an operator's open transaction may for
// hours), and the claim is made again, and for skipLockedFor after it,
// with ClaimJobsSkippingLocked, which steps over that job as claims always
// did. Inside the caller's transaction the claim always skips locked rows:
// there the lock timeout would outlive the claim, and a claim that ran
// into it would abort the caller's transaction.
func (s *PostgresStore) Claim(ctx context.Context, db DBTX, p ClaimParams) ([]*Job, error) {
	if err := s.checkClaim(p); err != nil {
		return nil, err
	}
	_, nested := db.(pgx.Tx)
	skipLocked := nested || time.Now().UnixNano() < s.skipLockedUntil.Load()
	claimed, err := s.claimWith(ctx, db, p, nested, skipLocked)
	var pgErr *pgconn.PgError
	if !skipLocked && errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		s.skipLockedUntil.Store(time.Now().Add(skipLockedFor).UnixNano())
		claimed, err = s.claimWith(ctx, db, p, nested, true)
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: claim from %s: %w", p.Queue, s.explain(err))
	}
	return claimed, nil
}

// How long a lock-free claim waits for a job's row, and how long the
// claims after one that waited too long skip locked rows instead.
const (
	claimLockTimeout = 200 * time.Millisecond
	skipLockedFor    = time.Minute
)

// claimWith is Claim's transaction, lock-free under the claim's lock
// timeout, or skipping locked rows.
func (s *PostgresStore) claimWith(ctx context.Context, db DBTX, p ClaimParams, nested, skipLocked bool) ([]*Job, error) {
	var claimed []*Job
	err := dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		// In a transaction of its own, the claim sets JIT off, bounds how
		// long it may idle holding its tenants' locks
		// (Config.ClaimIdleTimeout) and how long it waits for a job's row
		// (ClaimSettings). They end with the transaction; inside a
		// caller's transaction they would outlive the claim, so there the
		// server's settings apply.
		batch := &pgx.Batch{}
		if !nested {
			batch.Queue(s.sql.claimSettings, s.cfg.ClaimIdleTimeout.Milliseconds(), s.claimLockTimeout.Milliseconds())
		}
		batch.Queue(s.sql.lockClaimTenants, p.Queue, tenantsPerClaim(p.Limit))
		results := tx.SendBatch(ctx, batch)
		tenants, err := readClaimTenants(results, nested)
		if closeErr := results.Close(); err == nil {
			err = closeErr
		}
		if err != nil || len(tenants) == 0 {
			return err
		}
		shareOut(tenants, p.Limit, p.LowPriorityShare)
		n := len(tenants)
		names, weights := make([]string, n), make([]float64, n)
		urgent, relaxed, caps := make([]int32, n), make([]int32, n), make([]int32, n)
		for i, c := range tenants {
			names[i], weights[i], caps[i] = c.tenant, c.weight, int32(c.maxRunning)
			urgent[i], relaxed[i] = int32(c.given-c.relaxed), int32(c.relaxed)
		}
		// With a few tenants, ClaimJobs runs on its generic plan (the one the
		// plan test checks): planning it afresh cost as much as running it.
		// With many, the planner's view of the arrays' sizes is worth its
		// cost: measured on 100-job claims, the generic plan was about 30 %
		// faster for one tenant and 2.8 times slower for a hundred tenants
		// of one job each. Claims of 100 lock 7 tenants (tenantsPerClaim),
		// and there the generic plan drained a 1,000,000-job, 1,000-tenant
		// backlog about 5 % faster; at 32 tenants the two were level.
		batch = &pgx.Batch{}
		if !nested && len(tenants) <= genericPlanTenants {
			batch.Queue("SET LOCAL plan_cache_mode = force_generic_plan")
		}
		claim := s.sql.claim
		if skipLocked {
			claim = s.sql.claimSkippingLocked
		}
		batch.Queue(claim, p.Queue, names, urgent, relaxed, caps, weights,
			p.Worker, p.LeaseDuration.Milliseconds(), p.Kinds)
		results = tx.SendBatch(ctx, batch)
		claimed, err = readClaimed(results, batch.Len()-1)
		if closeErr := results.Close(); err == nil {
			err = closeErr
		}
		return err
	})
	return claimed, err
}

// genericPlanTenants is the most tenants a claim runs ClaimJobs for on its
// generic plan.
const genericPlanTenants = 8

// readClaimed reads ClaimJobs' rows after settings statements.
func readClaimed(results pgx.BatchResults, settings int) ([]*Job, error) {
	for range settings {
		if _, err := results.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanClaimed())
}

// readClaimTenants reads the results of the claim's first round trip: its
// settings (unless nested), then LockClaimTenants.
func readClaimTenants(results pgx.BatchResults, nested bool) ([]*tenantCandidate, error) {
	if !nested {
		if _, err := results.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*tenantCandidate, error) {
		var c tenantCandidate
		err := row.Scan(c.dest()...)
		return &c, err
	})
}

// shareOut offers limit jobs to the tenants by start-time fair queueing:
// each job goes to the tenant whose next job would finish first in virtual
// time (vtime + (given+1)/weight), so backlogged tenants are served in
// proportion to their weights and the one furthest behind goes first. A
// tenant whose running jobs already reach its cap (as last read) is offered
// none. Of each tenant's offer, a lowShare fraction (randomly rounded, so
// the expected share is exact for any batch size) is taken from its least
// urgent class.
func shareOut(tenants []*tenantCandidate, limit int, lowShare float64) {
	h := make(finishHeap, 0, len(tenants))
	for _, c := range tenants {
		if c.maxRunning > 0 && c.running >= c.maxRunning {
			continue
		}
		h = append(h, c)
	}
	heap.Init(&h)
	for range limit {
		if len(h) == 0 {
			break
		}
		c := h[0]
		c.given++
		if c.maxRunning > 0 && c.running+c.given >= c.maxRunning {
			heap.Pop(&h)
			continue
		}
		heap.Fix(&h, 0)
	}
	if lowShare <= 0 {
		return
	}
	for _, c := range tenants {
		want := float64(c.given) * lowShare
		whole, frac := math.Modf(want)
		c.relaxed = int(whole)
		if rand.Float64() < frac { //nolint:gosec // a rounding draw, not a secret
			c.relaxed++
		}
		c.relaxed = min(c.relaxed, c.given)
	}
}

// finishHeap orders tenants by the virtual finish time of their next job.
type finishHeap []*tenantCandidate

func (h finishHeap) finish(i int) float64 { return h[i].vtime + float64(h[i].given+1)/h[i].weight }
func (h finishHeap) Len() int             { return len(h) }
func (h finishHeap) Less(i, j int) bool {
	if fi, fj := h.finish(i), h.finish(j); fi != fj {
		return fi < fj
	}
	return h[i].tenant < h[j].tenant
}
func (h finishHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *finishHeap) Push(x any) {
	if c, ok := x.(*tenantCandidate); ok {
		*h = append(*h, c)
	}
}
func (h *finishHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// WakeIdleTenants implements Store: it makes active again the idle tenants
// of queue that have work eligible now, and returns how many it woke. With
// idleFor > 0 it looks only at tenants marked idle that recently, which is
// cheap whatever the number of idle tenants. The runner sweeps every idle
// tenant once per poll interval, and the recent ones when a NOTIFY brought
// it to a claim that came up short; see queries.sql.
func (s *PostgresStore) WakeIdleTenants(ctx context.Context, db DBTX, queue string, idleFor time.Duration) (int64, error) {
	if !s.queues[queue] {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "queue", Problem: fmt.Sprintf("%q is not one of the configured queues %q", queue, s.cfg.Queues), Cause: ErrUnknownQueue}
	}
	seconds := math.MaxInt32 * 1.0 // every idle tenant
	if idleFor > 0 {
		seconds = idleFor.Seconds()
	}
	tag, err := db.Exec(ctx, s.sql.wakeIdleTenants, queue, seconds)
	if err != nil {
		return 0, fmt.Errorf("jobs: waking idle tenants of %s: %w", queue, err)
	}
	return tag.RowsAffected(), nil
}

// SetTenantLimits stores tenant's weight and cap; they apply to its next
// claim. The empty tenant sets the defaults for tenants without limits of
// their own (initially weight 1, no cap).
func (s *PostgresStore) SetTenantLimits(ctx context.Context, db DBTX, tenant string, l TenantLimits) error {
	if err := checkTenantLimits(tenant, l); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, s.sql.setTenantLimits, tenant, l.Weight, l.MaxRunning); err != nil {
		return fmt.Errorf("jobs: setting limits of tenant %q: %w", tenant, err)
	}
	return nil
}

// DeleteTenantLimits removes tenant's own limits: the defaults apply to it
// again. The defaults (the empty tenant) cannot be deleted.
func (s *PostgresStore) DeleteTenantLimits(ctx context.Context, db DBTX, tenant string) error {
	if tenant == "" {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "tenant", Problem: "must not be empty: the defaults can be changed, not deleted"}
	}
	if _, err := db.Exec(ctx, s.sql.deleteTenantLimits, tenant); err != nil {
		return fmt.Errorf("jobs: deleting limits of tenant %q: %w", tenant, err)
	}
	return nil
}

// TenantLimitsOf returns the limits that apply to tenant: its own, or the
// defaults (the empty tenant's).
func (s *PostgresStore) TenantLimitsOf(ctx context.Context, db DBTX, tenant string) (TenantLimits, error) {
	var l TenantLimits
	err := db.QueryRow(ctx, s.sql.getTenantLimits, tenant).Scan(limitsDest(&l)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return TenantLimits{Weight: 1}, nil
	}
	if err != nil {
		return l, fmt.Errorf("jobs: reading limits of tenant %q: %w", tenant, err)
	}
	return l, nil
}

func checkTenantLimits(tenant string, l TenantLimits) error {
	fail := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	if tenant != "" {
		if problem := checkText(tenant, true, MaxTenantLen); problem != "" {
			return fail("tenant", problem)
		}
	}
	switch {
	case l.Weight < 1 || l.Weight > MaxTenantWeight:
		return fail("Weight", fmt.Sprintf("is %d; use 1 to %d", l.Weight, MaxTenantWeight))
	case l.MaxRunning < 0 || l.MaxRunning > math.MaxInt32:
		return fail("MaxRunning", fmt.Sprintf("is %d; use 0 (no cap) or a positive number", l.MaxRunning))
	}
	return nil
}

// tenantsPerClaim is how many tenants a claim of limit jobs locks: one for
// every claimQuantum jobs, at least minTenantsPerClaim, at most limit.
// Each locked tenant's row is updated by the claim (its virtual time), and
// each is read through its own range of the claim index, so locking a
// tenant per job made a many-tenant claim write a tenant row per job
// claimed. With fewer tenants per claim, a backlogged tenant is served up
// to about claimQuantum jobs at a time, and tenants take turns by virtual
// time as before: over any longer window the shares are the same, and a
// tenant that becomes active is still among the first locked.
func tenantsPerClaim(limit int) int {
	return min(limit, max(minTenantsPerClaim, (limit+claimQuantum-1)/claimQuantum))
}

// claimQuantum and minTenantsPerClaim: see tenantsPerClaim.
const (
	claimQuantum       = 16
	minTenantsPerClaim = 4
)
