package lease

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// countingTracer counts the round trips a pool makes: each statement sent
// alone and each batch.
type countingTracer struct{ n *atomic.Int64 }

func (t countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// benchAdapter is a candidate's client that calls nothing.
type benchAdapter struct{}

func (benchAdapter) Provider() string { return "bench" }

// BenchmarkAdmittedCall is one attempt's admission on the Postgres limiter
// (acquire, an answered call, release) with a handler that answers at
// once: a kind with one pool against a routed kind whose first candidate
// grants. Routing adds no limiter round trip, so the two should match.
//
//	go test -run '^$' -bench AdmittedCall -benchtime 3000x ./lease/
func BenchmarkAdmittedCall(b *testing.B) {
	db := dbtest.Setup(b, dbtest.Options{MaxConns: 4})
	// A pool of its own whose tracer counts the round trips the limiter
	// makes: round trips per attempt, whatever the machine's load.
	var roundTrips atomic.Int64
	cfg := db.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = countingTracer{&roundTrips}
	counted, err := pgxpool.NewWithConfig(b.Context(), cfg)
	require.NoError(b, err)
	b.Cleanup(counted.Close)
	limiter, err := admission.NewPostgres(counted, admission.Config{Schema: db.Schema})
	require.NoError(b, err)
	for _, pool := range []string{"primary", "secondary"} {
		require.NoError(b, limiter.SetPool(b.Context(), admission.Pool{Name: pool, RPM: 1e9, TPM: 1e12, MaxInFlight: 1000}))
	}
	answer := HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		Responded(ctx, http.StatusOK, nil)
		RecordUsage(ctx, jobs.Usage{InputTokens: 10, OutputTokens: 5})
		return json.RawMessage(`{}`), nil
	})
	single := &Admission{Limiter: limiter, Route: func(j *jobs.Job) (admission.Request, bool) {
		return admission.Request{Pool: "primary", Tenant: j.Tenant, Tokens: 100}, true
	}}
	routes := map[string]Route{"extract": {Candidates: []Candidate{
		{Pool: "primary", Model: "m1", Adapter: benchAdapter{}},
		{Pool: "secondary", Model: "m2", Adapter: benchAdapter{}},
	}}}
	routedAdmission := &Admission{Limiter: limiter, Routes: routes, Route: single.Route}
	for name, a := range map[string]*Admission{"single": single, "routed": routedAdmission} {
		a, err := a.withDefaults(DefaultAttemptTimeout)
		require.NoError(b, err)
		a.obs, err = newInstruments(Config{})
		require.NoError(b, err)
		h := a.wrap(map[string]Handler{"extract": answer})["extract"]
		job := &jobs.Job{Kind: "extract", Tenant: "acme"}
		b.Run(name, func(b *testing.B) {
			before := roundTrips.Load()
			for b.Loop() {
				if _, err := h.Work(b.Context(), job); err != nil {
					b.Fatal(err)
				}
			}
			if f, ok := a.Limiter.(flusher); ok {
				require.NoError(b, f.Flush(b.Context()))
			}
			b.ReportMetric(float64(roundTrips.Load()-before)/float64(b.N), "roundtrips/op")
		})
	}
}
