package jobs_test

import (
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// BenchmarkEnqueue accepts one job and its requested event per transaction
// from many goroutines, with idempotency keys, and reports jobs/s.
//
//	go test -run '^$' -bench Enqueue -benchtime 20000x ./jobs
func BenchmarkEnqueue(b *testing.B) {
	const parallelism = 8 // goroutines per GOMAXPROCS
	f := setup(b, dbtest.Options{MaxConns: int32(parallelism * runtime.GOMAXPROCS(0))})
	var seq atomic.Int64

	b.Run("statement", func(b *testing.B) {
		b.SetParallelism(parallelism)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n := seq.Add(1)
				_, err := f.store.Enqueue(b.Context(), f.pool, benchParams(n))
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	})

	b.Run("caller_tx", func(b *testing.B) {
		b.SetParallelism(parallelism)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				n := seq.Add(1)
				err := pgx.BeginFunc(b.Context(), f.pool, func(tx pgx.Tx) error {
					_, err := f.store.Enqueue(b.Context(), tx, benchParams(n))
					return err
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	})
}

// BenchmarkEnqueueMany accepts batches of 100 jobs and reports jobs/s.
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
