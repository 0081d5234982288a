package lease

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

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
	limiter, err := admission.NewPostgres(db.Pool, admission.Config{Schema: db.Schema})
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
			for b.Loop() {
				if _, err := h.Work(b.Context(), job); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
