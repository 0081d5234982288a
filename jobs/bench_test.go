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
