package admission_test

import (
	"testing"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// BenchmarkPostgresAcquireRelease is one grant and its release on one hot
// pool, from b's parallel goroutines in one process (llmq bench -mode
// admission measures several processes).
func BenchmarkPostgresAcquireRelease(b *testing.B) {
	db := setupBench(b)
	l, err := admission.NewPostgres(db.Pool, admission.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	benchAcquireRelease(b, l)
}

func BenchmarkLocalAcquireRelease(b *testing.B) {
	l, err := admission.NewLocal()
	if err != nil {
		b.Fatal(err)
	}
	benchAcquireRelease(b, l)
}

func benchAcquireRelease(b *testing.B, l limiter) {
	b.Helper()
	if err := l.SetPool(b.Context(), admission.Pool{Name: "hot", RPM: 1 << 30, TPM: 1 << 50, MaxInFlight: 1 << 30}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := l.Acquire(b.Context(), admission.Request{Pool: "hot", Tenant: "bench", Tokens: 500})
			if err != nil {
				b.Error(err)
				return
			}
			if err := p.Release(b.Context(), admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 300}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func setupBench(b *testing.B) *dbtest.DB {
	b.Helper()
	return dbtest.Setup(b, dbtest.Options{MaxConns: 8})
}
