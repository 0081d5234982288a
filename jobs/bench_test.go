package jobs_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// BenchmarkEnqueue accepts one job and its requested event per transaction
// from many goroutines, with idempotency keys, and reports jobs/s. Each
// variant starts from an empty schema of its own.
//
//	go test -run '^$' -bench 'Enqueue$' -benchtime 10000x -count 3 ./jobs
func BenchmarkEnqueue(b *testing.B) {
	const parallelism = 8 // goroutines per GOMAXPROCS
	conns := int32(parallelism * runtime.GOMAXPROCS(0))
	variants := []struct {
		name     string
		cfg      jobs.Config
		callerTx bool
	}{
		{name: "statement"},
		{name: "caller_tx", callerTx: true},
		{name: "statement_notify_every_enqueue", cfg: jobs.Config{NotifyInterval: -1}},
		{name: "statement_without_notify", cfg: jobs.Config{DisableNotify: true}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			db := dbtest.Setup(b, dbtest.Options{MaxConns: conns})
			v.cfg.Schema = db.Schema
			store, err := jobs.NewStore(v.cfg)
			require.NoError(b, err)
			var seq atomic.Int64
			enqueue := func(n int64) error {
				if !v.callerTx {
					_, err := store.Enqueue(b.Context(), db.Pool, benchParams(n))
					return err
				}
				return pgx.BeginFunc(b.Context(), db.Pool, func(tx pgx.Tx) error {
					_, err := store.Enqueue(b.Context(), tx, benchParams(n))
					return err
				})
			}
			b.SetParallelism(parallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := enqueue(seq.Add(1)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}

// BenchmarkEnqueueMany accepts batches of 100 jobs and reports jobs/s.
//
//	go test -run '^$' -bench EnqueueMany -benchtime 1000x -count 3 ./jobs
func BenchmarkEnqueueMany(b *testing.B) {
	f := setup(b)
	const batch = 100
	var seq int64
	b.ResetTimer()
	for b.Loop() {
		params := make([]jobs.EnqueueParams, batch)
		for i := range params {
			seq++
			params[i] = benchParams(seq)
		}
		_, err := f.store.EnqueueMany(b.Context(), f.pool, params)
		require.NoError(b, err)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "jobs/s")
}

func benchParams(n int64) jobs.EnqueueParams {
	return jobs.EnqueueParams{
		Tenant:         "tenant-" + strconv.FormatInt(n%100, 10),
		Kind:           "invoice.extract",
		Payload:        []byte(fmt.Sprintf(`{"document":"doc-%d","version":1}`, n)),
		IdempotencyKey: "key-" + strconv.FormatInt(n, 10),
	}
}

// BenchmarkStep measures a durable step's own cost to the store, as
// lease.Step spends it: "run" is a first attempt's TakeStep that finds
// nothing and its SaveStep (two statements); "reuse" is a later attempt's
// TakeStep of a stored step (one statement, which records the reuse). Both
// report the WAL each step wrote, which load does not change.
//
//	go test -run '^$' -bench Step -benchtime 5000x -count 3 ./jobs
func BenchmarkStep(b *testing.B) {
	f := setup(b)
	ctx := b.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(b, err)
	claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: 1, LeaseDuration: time.Hour})
	require.NoError(b, err)
	require.Len(b, claimed, 1)
	lease := jobs.Lease{JobID: res.Job.ID, Fence: claimed[0].Fence}
	output := json.RawMessage(`{"text":"` + strings.Repeat("INVOICE 42 TOTAL 1234.50 EUR ", 6) + `"}`) // about 180 bytes
	walPerStep := func(from string, steps int) float64 {
		var bytes float64
		require.NoError(b, f.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", from).Scan(&bytes))
		return bytes / float64(steps)
	}
	walNow := func() string {
		var lsn string
		require.NoError(b, f.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn))
		return lsn
	}
	var stored int
	b.Run("run", func(b *testing.B) {
		from := walNow()
		for b.Loop() {
			name := "step-" + strconv.Itoa(stored)
			stored++
			_, found, err := f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: lease, Name: name})
			require.NoError(b, err)
			require.False(b, found)
			_, err = f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: lease, Name: name, Output: output,
				Usage: jobs.Usage{InputTokens: 900, OutputTokens: 40}})
			require.NoError(b, err)
		}
		b.ReportMetric(walPerStep(from, b.N), "wal_bytes/step")
	})
	// A later attempt of the same job: what the reaper and a new claim
	// would leave, written directly.
	_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET attempt = attempt + 1, fence = fence + 2 WHERE id = $1", lease.JobID)
	require.NoError(b, err)
	later := jobs.Lease{JobID: lease.JobID, Fence: lease.Fence + 2}
	b.Run("reuse", func(b *testing.B) {
		from, i := walNow(), 0
		for b.Loop() {
			_, found, err := f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: later, Name: "step-" + strconv.Itoa(i%stored)})
			require.NoError(b, err)
			require.True(b, found)
			i++
		}
		b.ReportMetric(walPerStep(from, b.N), "wal_bytes/step")
	})
}

// BenchmarkEnqueueBatch accepts batches of 10,000 jobs (EnqueueBatch: the
// batch row and every job in one transaction) and reports the time per
// batch.
//
//	go test -run '^$' -bench EnqueueBatch -benchtime 10x -count 3 ./jobs
func BenchmarkEnqueueBatch(b *testing.B) {
	f := setup(b)
	const size = jobs.MaxBatch
	seq := 0
	for b.Loop() {
		p := jobs.EnqueueBatchParams{Tenant: "acme", Key: "upload-" + strconv.Itoa(seq)}
		seq++
		for i := range size {
			p.Jobs = append(p.Jobs, jobs.EnqueueParams{Kind: "invoice.extract", Payload: json.RawMessage(`{"doc":` + strconv.Itoa(i) + `}`)})
		}
		_, err := f.store.EnqueueBatch(b.Context(), f.pool, p)
		require.NoError(b, err)
	}
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "jobs/s")
}

// BenchmarkBatchProgress reads a batch's progress (Batch) for batches of
// 10 and of 10,000 jobs: one primary-key probe of job_batches either way,
// so the two cost the same.
//
//	go test -run '^$' -bench BatchProgress -count 3 ./jobs
func BenchmarkBatchProgress(b *testing.B) {
	for _, size := range []int{10, jobs.MaxBatch} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			f := setup(b)
			p := jobs.EnqueueBatchParams{Tenant: "acme", Key: "upload"}
			for i := range size {
				p.Jobs = append(p.Jobs, jobs.EnqueueParams{Kind: "invoice.extract", Payload: json.RawMessage(`{"doc":` + strconv.Itoa(i) + `}`)})
			}
			res, err := f.store.EnqueueBatch(b.Context(), f.pool, p)
			require.NoError(b, err)
			for b.Loop() {
				got, err := f.store.Batch(b.Context(), f.pool, "acme", res.Batch.ID)
				require.NoError(b, err)
				require.Equal(b, size, got.Total)
			}
		})
	}
}

// BenchmarkComplete records the success of claimed jobs in batches of 500,
// as a busy runner's completer does (one CompleteJobs statement writes the
// jobs, their attempt rows and one batch row of events), and reports the
// database's time per job. Enqueueing and claiming are not timed.
//
//	go test -run '^$' -bench Complete -benchtime 40x -count 3 ./jobs
func BenchmarkComplete(b *testing.B) {
	f := setup(b)
	ctx := b.Context()
	const size = 500
	params := make([]jobs.EnqueueParams, size)
	for i := range params {
		params[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "k"}
	}
	b.StopTimer()
	for range b.N {
		_, err := f.store.EnqueueMany(ctx, f.pool, params)
		require.NoError(b, err)
		claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"k"}, Worker: "w", Limit: size, LeaseDuration: time.Minute})
		require.NoError(b, err)
		require.Len(b, claimed, size)
		completions := make([]jobs.Completion, size)
		for i, j := range claimed {
			completions[i] = succeeded(j, `{}`)
		}
		b.StartTimer()
		results, err := f.store.Complete(ctx, f.pool, completions)
		b.StopTimer()
		require.NoError(b, err)
		require.Len(b, results, size)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*size), "µs/job")
}
