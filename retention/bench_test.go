package retention_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/retention"
)

// walLSN reads the WAL insert position. WAL is shared by the whole server:
// run this on a quiet one, and take the lowest of a few runs.
func walLSN(b *testing.B, f *fixture) int64 {
	b.Helper()
	var lsn int64
	if err := f.db.Pool.QueryRow(b.Context(), "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

// finishedJobs accepts n keyed jobs, claims and completes them, and
// returns the WAL bytes the completions wrote.
func finishedJobs(b *testing.B, f *fixture, n int) int64 {
	b.Helper()
	ctx := b.Context()
	params := make([]jobs.EnqueueParams, n)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: []byte(`{}`), IdempotencyKey: fmt.Sprint("k", i)}
	}
	for start := 0; start < n; start += jobs.MaxBatch {
		if _, err := f.store.EnqueueMany(ctx, f.db.Pool, params[start:min(n, start+jobs.MaxBatch)]); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := f.db.Pool.Exec(ctx, "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
	before := walLSN(b, f)
	for {
		claimed, err := f.store.Claim(ctx, f.db.Pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 500, LeaseDuration: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if len(claimed) == 0 {
			return walLSN(b, f) - before
		}
		cs := make([]jobs.Completion, len(claimed))
		for i, j := range claimed {
			cs[i] = jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: j.LeaseOwner, Outcome: jobs.OutcomeSucceeded, Result: []byte(`{}`)}
		}
		if _, err := f.store.Complete(ctx, f.db.Pool, cs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPruneWAL measures, in WAL bytes per job (full-page images
// included, after a checkpoint as in steady state), what pruning a
// finished job costs (its row, attempt, key, outbox events and their index
// entries), and what jobs_finished_idx, the index pruning reads, adds to a
// drain (claim and completion), against the same drain without it.
//
//	go test -run '^$' -bench PruneWAL -benchtime 5000x ./retention/
func BenchmarkPruneWAL(b *testing.B) {
	n := b.N
	plain := setup(b)
	if _, err := plain.db.Pool.Exec(b.Context(), "DROP INDEX "+plain.db.Schema+".jobs_finished_idx"); err != nil {
		b.Fatal(err)
	}
	drainWithout := finishedJobs(b, plain, n)

	f := setup(b)
	drainWith := finishedJobs(b, f, n)
	for _, sql := range []string{
		"UPDATE " + f.db.Schema + ".jobs SET finished_at = now() - interval '2 days'",
		"UPDATE " + f.db.Schema + ".outbox SET published_at = now() - interval '2 days'",
		"VACUUM " + f.db.Schema + ".jobs, " + f.db.Schema + ".outbox",
		"CHECKPOINT",
	} {
		if _, err := f.db.Pool.Exec(b.Context(), sql); err != nil {
			b.Fatal(err)
		}
	}
	svc, err := retention.New(f.db.Pool, retention.Config{Schema: f.db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	before := walLSN(b, f)
	pass, err := svc.PruneOnce(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	pruned := walLSN(b, f) - before
	b.StopTimer()
	if pass.Total() < int64(5*n) {
		b.Fatalf("pruned %v, want jobs, attempts, keys and two events of %d jobs", pass.Deleted, n)
	}
	b.ReportMetric(float64(pruned)/float64(n), "prune-wal-B/job")
	b.ReportMetric(float64(drainWith)/float64(n), "drain-wal-B/job")
	b.ReportMetric(float64(drainWith-drainWithout)/float64(n), "finished-idx-wal-B/job")
}
