package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// A job whose key has a computed success is recorded with that result
// without its handler being called, and the host's OnSucceeded hook runs
// for it as for a computed success, in the transaction that records it.
func TestRunnerReusesAResultWithoutCallingTheHandler(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".deliveries (job_id uuid PRIMARY KEY, result jsonb)")
	require.NoError(t, err)
	var mu sync.Mutex
	calls := map[uuid.UUID]int{}
	cfg := fastConfig(map[string]lease.Handler{
		"k": lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
			mu.Lock()
			defer mu.Unlock()
			calls[job.ID]++
			return json.RawMessage(`{"total":7}`), nil
		}),
	})
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".deliveries (job_id, result) VALUES ($1, $2)", job.ID, string(job.Result))
		return err
	}
	f.start(cfg)

	reuse := &jobs.Reuse{Key: "sha256:doc"}
	first := f.enqueue(jobs.EnqueueParams{Kind: "k", Reuse: reuse})
	f.await(first.ID)
	second := f.enqueue(jobs.EnqueueParams{Kind: "k", Reuse: reuse})
	got := f.await(second.ID)
	require.Equal(t, jobs.StateSucceeded, got.State)
	require.Equal(t, first.ID, got.ReusedFrom)
	require.JSONEq(t, `{"total":7}`, string(got.Result))

	mu.Lock()
	require.Equal(t, map[uuid.UUID]int{first.ID: 1}, calls, "the handler ran for the first job only")
	mu.Unlock()
	attempts := f.attempts(second.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptReused, attempts[0].Outcome)
	require.Equal(t, first.ID, attempts[0].ReusedFrom)

	var delivered int
	require.NoError(t, f.pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+f.schema+".deliveries WHERE job_id = $1 AND result = '{\"total\":7}'", second.ID).Scan(&delivered))
	require.Equal(t, 1, delivered, "the hook ran for the reused job, with its result")
}

// Under tenant-scoped keys, no job of one tenant ever receives a result
// computed for another, including while jobs of one key coalesce across
// runners: three tenants share ten keys, four jobs each, worked by three
// runners at once. Each tenant's key is computed once, or twice where its
// first call failed, and every other job of it reuses that tenant's own
// result.
func TestTenantKeysNeverShareResultsAcrossTenants(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const tenants, keys, copies = 3, 10, 4
	var mu sync.Mutex
	calls := map[string]int{} // "tenant/key"
	handler := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		name := job.Tenant + "/" + job.Reuse.Key
		mu.Lock()
		calls[name]++
		n := calls[name]
		mu.Unlock()
		select { // long enough that the other jobs of its key are claimable meanwhile
		case <-time.After(30 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if job.Reuse.Key == "key-0" && n == 1 {
			return nil, fmt.Errorf("%s: provider busy", name) // a plain error is transient
		}
		return json.Marshal(map[string]string{"tenant": job.Tenant, "key": job.Reuse.Key})
	})
	for i := range 3 {
		cfg := fastConfig(map[string]lease.Handler{"k": handler})
		cfg.WorkerID = fmt.Sprintf("runner-%d", i)
		cfg.Queues = map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 8}}
		f.start(cfg)
	}

	byTenant := map[string][]uuid.UUID{}
	for c := range copies {
		for tn := range tenants {
			tenant := fmt.Sprintf("tenant-%d", tn)
			params := make([]jobs.EnqueueParams, keys)
			for k := range params {
				params[k] = jobs.EnqueueParams{Tenant: tenant, Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"copy":%d}`, c)),
					Reuse: &jobs.Reuse{Key: fmt.Sprintf("key-%d", k)}}
			}
			res, err := f.store.EnqueueMany(t.Context(), f.pool, params)
			require.NoError(t, err)
			for _, r := range res {
				byTenant[tenant] = append(byTenant[tenant], r.Job.ID)
			}
		}
	}

	reused := 0
	for tenant, ids := range byTenant {
		for _, id := range ids {
			job := f.awaitIn(tenant, id)
			require.Equal(t, jobs.StateSucceeded, job.State)
			var result map[string]string
			require.NoError(t, json.Unmarshal(job.Result, &result))
			require.Equal(t, map[string]string{"tenant": tenant, "key": job.Reuse.Key}, result, "job %s of %s", id, tenant)
			if job.ReusedFrom != uuid.Nil {
				reused++
				source, err := f.store.Get(t.Context(), f.pool, tenant, job.ReusedFrom)
				require.NoError(t, err, "the source is the tenant's own job")
				require.Equal(t, job.Reuse.Key, source.Reuse.Key)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for tn := range tenants {
		for k := range keys {
			name := fmt.Sprintf("tenant-%d/key-%d", tn, k)
			want := 1
			if k == 0 {
				want = 2 // the first call failed; one other job of the key ran
			}
			require.Equal(t, want, calls[name], "calls for %s", name)
		}
	}
	require.Equal(t, tenants*keys*copies-tenants*keys, reused, "each key computed once successfully; every other job reused it")
}
