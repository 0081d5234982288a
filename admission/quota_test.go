package admission_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

type quotaFixture struct {
	*fixture
	quotas *admission.Quotas
	store  *jobs.PostgresStore
}

func setupQuotas(t *testing.T, cfg admission.QuotaConfig) *quotaFixture {
	t.Helper()
	f := setup(t)
	cfg.Schema = f.schema
	q, err := admission.NewQuotas(cfg)
	require.NoError(t, err)
	store, err := jobs.NewStore(jobs.Config{Schema: f.schema, OnAccept: q.Hook()})
	require.NoError(t, err)
	return &quotaFixture{fixture: f, quotas: q, store: store}
}

func (f *quotaFixture) enqueue(p jobs.EnqueueParams) (*jobs.Job, error) {
	if p.Kind == "" {
		p.Kind = "extract"
	}
	res, err := f.store.Enqueue(f.t.Context(), f.pool, p)
	return res.Job, err
}

// written counts the tenant's jobs and their requested events.
func (f *quotaFixture) written(tenant string) (jobCount, events int) {
	f.t.Helper()
	require.NoError(f.t, f.pool.QueryRow(f.t.Context(),
		"SELECT count(*), (SELECT count(*) FROM "+dbtest.OutboxEvents(f.schema, "o")+" JOIN "+f.schema+".jobs j ON j.id = o.aggregate_id WHERE j.tenant = $1) FROM "+f.schema+".jobs WHERE tenant = $1",
		tenant).Scan(&jobCount, &events))
	return jobCount, events
}

func requireQuotaError(t *testing.T, err error, status int, dimension string) *admission.QuotaError {
	t.Helper()
	var q *admission.QuotaError
	require.ErrorAs(t, err, &q)
	require.Equal(t, status, q.Status)
	require.Equal(t, dimension, q.Dimension)
	require.Positive(t, q.RetryAfter)
	if status == http.StatusTooManyRequests {
		require.ErrorIs(t, err, admission.ErrOverQuota)
	} else {
		require.ErrorIs(t, err, admission.ErrAtCapacity)
	}
	return q
}

func TestTenantPendingJobsQuota(t *testing.T) {
	t.Parallel()
	f := setupQuotas(t, admission.QuotaConfig{Default: admission.TenantQuota{MaxPendingJobs: 3}, RetryHint: 10 * time.Second})
	var first *jobs.Job
	for i := range 3 {
		j, err := f.enqueue(jobs.EnqueueParams{Tenant: "acme", IdempotencyKey: string(rune('a' + i))})
		require.NoError(t, err)
		first = cmpOr(first, j)
	}
	_, err := f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
	q := requireQuotaError(t, err, http.StatusTooManyRequests, "pending_jobs")
	require.Equal(t, int64(3), q.Limit)
	require.Equal(t, int64(4), q.Current)
	require.Equal(t, 10*time.Second, q.RetryAfter)
	n, events := f.written("acme")
	require.Equal(t, 3, n, "the refused job was not written")
	require.Equal(t, 3, events, "nor its event")

	again, err := f.enqueue(jobs.EnqueueParams{Tenant: "acme", IdempotencyKey: "a"})
	require.NoError(t, err, "a retried acceptance of accepted work is never refused")
	require.Equal(t, first.ID, again.ID)

	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "other"})
	require.NoError(t, err, "quotas are per tenant")

	// Inside the caller's transaction: the refusal rolls back only the
	// enqueue, and the caller's transaction goes on.
	require.NoError(t, pgx.BeginFunc(t.Context(), f.pool, func(tx pgx.Tx) error {
		_, err := f.store.Enqueue(t.Context(), tx, jobs.EnqueueParams{Tenant: "acme", Kind: "extract"})
		_ = requireQuotaError(t, err, http.StatusTooManyRequests, "pending_jobs")
		_, err = tx.Exec(t.Context(), "SELECT 1")
		return err
	}))

	// A finished job frees its place.
	_, err = f.store.Cancel(t.Context(), f.pool, "acme", first.ID)
	require.NoError(t, err)
	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
	require.NoError(t, err)
}

// Work enqueued because other work finished (webhook deliveries from
// OnSucceeded) is never refused when its queue is left out of
// QuotaConfig.Queues: refusing it would run the finished job again.
func TestQuotaQueues(t *testing.T) {
	t.Parallel()
	f := setup(t)
	q, err := admission.NewQuotas(admission.QuotaConfig{Schema: f.schema, Default: admission.TenantQuota{MaxPendingJobs: 1}, Queues: []string{"extraction"}})
	require.NoError(t, err)
	store, err := jobs.NewStore(jobs.Config{Schema: f.schema, Queues: []string{"extraction", "webhooks"}, OnAccept: q.Hook()})
	require.NoError(t, err)
	_, err = store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "extract", Queue: "extraction"})
	require.NoError(t, err)
	for range 3 {
		_, err = store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "webhook.deliver", Queue: "webhooks"})
		require.NoError(t, err, "deliveries are not checked")
	}
	_, err = store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "extract", Queue: "extraction"})
	_ = requireQuotaError(t, err, http.StatusTooManyRequests, "pending_jobs")
}

func cmpOr(a, b *jobs.Job) *jobs.Job {
	if a != nil {
		return a
	}
	return b
}

func TestTenantQuotaDimensions(t *testing.T) {
	t.Parallel()
	f := setupQuotas(t, admission.QuotaConfig{})
	ctx := t.Context()
	require.NoError(t, f.quotas.SetTenantQuota(ctx, f.pool, "tokens", admission.TenantQuota{MaxPendingTokens: 1000}))
	require.NoError(t, f.quotas.SetTenantQuota(ctx, f.pool, "bytes", admission.TenantQuota{MaxPendingBytes: 100}))
	require.NoError(t, f.quotas.SetTenantQuota(ctx, f.pool, "batch", admission.TenantQuota{MaxPendingJobs: 2}))

	_, err := f.enqueue(jobs.EnqueueParams{Tenant: "tokens", EstimatedTokens: 600})
	require.NoError(t, err)
	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "tokens", EstimatedTokens: 600})
	_ = requireQuotaError(t, err, http.StatusTooManyRequests, "pending_tokens")

	payload := json.RawMessage(`{"document_id":"` + strings.Repeat("x", 50) + `"}`)
	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "bytes", Payload: payload})
	require.NoError(t, err)
	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "bytes", Payload: payload})
	_ = requireQuotaError(t, err, http.StatusTooManyRequests, "pending_bytes")

	_, err = f.store.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{
		{Tenant: "batch", Kind: "extract"}, {Tenant: "batch", Kind: "extract"}, {Tenant: "batch", Kind: "extract"},
	})
	_ = requireQuotaError(t, err, http.StatusTooManyRequests, "pending_jobs")
	n, _ := f.written("batch")
	require.Zero(t, n, "a batch over quota is refused whole")

	require.ErrorIs(t, f.quotas.SetTenantQuota(ctx, f.pool, "x", admission.TenantQuota{MaxPendingJobs: -1}), admission.ErrInvalid)
	require.ErrorIs(t, f.quotas.SetTenantQuota(ctx, f.pool, "x\x00", admission.TenantQuota{}), admission.ErrInvalid)
}

// Concurrent acceptances of one tenant never pass its quota together.
func TestTenantQuotaHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := setupQuotas(t, admission.QuotaConfig{Default: admission.TenantQuota{MaxPendingJobs: 5}})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted int
	)
	for range 16 {
		wg.Go(func() {
			_, err := f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				accepted++
			} else {
				require.ErrorIs(t, err, admission.ErrOverQuota)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 5, accepted)
	n, _ := f.written("acme")
	require.Equal(t, 5, n)
}

func TestSystemCapacity(t *testing.T) {
	t.Parallel()
	f := setupQuotas(t, admission.QuotaConfig{SystemMaxPendingJobs: 4})
	for _, tenant := range []string{"a", "b", "c", "d"} {
		_, err := f.enqueue(jobs.EnqueueParams{Tenant: tenant})
		require.NoError(t, err)
	}
	_, err := f.enqueue(jobs.EnqueueParams{Tenant: "e"})
	q := requireQuotaError(t, err, http.StatusServiceUnavailable, "system_pending_jobs")
	require.Equal(t, int64(4), q.Limit)
	n, _ := f.written("e")
	require.Zero(t, n)
}

func TestUsageLedgerAndDailySpend(t *testing.T) {
	t.Parallel()
	f := setupQuotas(t, admission.QuotaConfig{Default: admission.TenantQuota{MaxDailyCost: 10_000}})
	ctx := t.Context()
	require.NoError(t, f.pg.SetPool(ctx, admission.Pool{Name: "gpt", RPM: 600, TPM: 1e6, MaxInFlight: 10,
		InputPrice: 2_500_000, OutputPrice: 10_000_000}))
	release := func(tenant string, o admission.CallOutcome) {
		p, err := f.pg.Acquire(ctx, admission.Request{Pool: "gpt", Tenant: tenant, Tokens: 2000})
		require.NoError(t, err)
		require.NoError(t, p.Release(ctx, o))
	}
	release("acme", admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 1000, OutputTokens: 500})
	release("acme", admission.CallOutcome{Result: admission.CallUncertain})
	release("acme", admission.CallOutcome{Result: admission.CallNotSent})
	release("", admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 1000})

	usage, err := f.pg.Usage(ctx, "acme", time.Now(), time.Now())
	require.NoError(t, err)
	require.Len(t, usage, 1)
	u := usage[0]
	require.Equal(t, "gpt", u.Pool)
	require.Equal(t, int64(2), u.Attempts, "calls sent; the unsent one is not usage")
	require.Equal(t, int64(1), u.UncertainAttempts)
	require.Equal(t, int64(1000), u.InputTokens, "reported usage, not the 2000 reserved")
	require.Equal(t, int64(500), u.OutputTokens)
	require.Equal(t, int64(1000*2.5+500*10), u.Cost)

	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
	require.NoError(t, err, "7,500 spent of 10,000")
	release("acme", admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 1000})
	_, err = f.enqueue(jobs.EnqueueParams{Tenant: "acme"})
	q := requireQuotaError(t, err, http.StatusTooManyRequests, "daily_cost")
	require.Equal(t, int64(10_000), q.Current)
	require.LessOrEqual(t, q.RetryAfter, 24*time.Hour, "until the next UTC day")
}
