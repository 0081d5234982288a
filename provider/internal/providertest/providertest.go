// Package providertest runs the provider adapters' tests against real
// components: the example's fake provider behind a real HTTP server, and a
// lease runner on a migrated PostgreSQL schema whose attempts hold permits
// of a local admission limiter.
package providertest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// The admission pool every attempt draws from, and what it reserves.
const (
	Pool    = "provider"
	Reserve = 1000 // tokens per attempt: the pool's whole token burst
	// TokensPerSecond is the pool's token refill (TPM 60): slow enough
	// that a test reads what an attempt's release refunded.
	TokensPerSecond = 1
)

// Document is an invoice the fake model reads.
const Document = fakeprovider.SampleInvoice

// Env is one test's provider and runner fixture.
type Env struct {
	// Provider is the fake provider; URL its base URL (…/v1).
	Provider *fakeprovider.Server
	URL      string
	// Limiter holds the pool the attempts draw from.
	Limiter *admission.Local
	// Unadmitted runs attempts without lease.Admission: no permit, and
	// only the adapter to say how a call ended.
	Unadmitted bool

	requests atomic.Int64
	db       *dbtest.DB
	store    *jobs.PostgresStore
}

// New starts a fake provider with cfg (1ms mean latency unless cfg says
// otherwise) and a migrated schema.
func New(t *testing.T, cfg fakeprovider.Config) *Env {
	t.Helper()
	if cfg.Scale == 0 {
		cfg.Scale = 15_000
	}
	e := &Env{Provider: fakeprovider.New(cfg)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.requests.Add(1)
		e.Provider.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.URL = srv.URL + "/v1"
	limiter, err := admission.NewLocal(admission.Pool{Name: Pool, RPM: 6000, TPM: 60 * TokensPerSecond, TokenBurst: Reserve, MaxInFlight: 10})
	require.NoError(t, err)
	e.Limiter = limiter
	e.db = dbtest.Setup(t, dbtest.Options{MaxConns: 8})
	e.store, err = jobs.NewStore(jobs.Config{Schema: e.db.Schema})
	require.NoError(t, err)
	return e
}

// Requests is how many HTTP requests reached the provider's server.
func (e *Env) Requests() int64 { return e.requests.Load() }

// ClosedURL is a base URL nothing listens on: a call to it is refused
// before anything is sent.
func ClosedURL(t *testing.T) string {
	t.Helper()
	l, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr + "/v1"
}

// Attempt runs handler as the first attempt of a new job, under a lease
// runner whose attempts each hold a permit of Pool reserving Reserve
// tokens (unless Unadmitted), and returns the attempt as the job's history records it. A
// retry is scheduled a minute later at the earliest, so no second attempt
// runs.
func (e *Env) Attempt(t *testing.T, handler lease.HandlerFunc) jobs.Attempt {
	t.Helper()
	ctx := t.Context()
	cfg := lease.Config{
		Handlers:       map[string]lease.Handler{"call": handler},
		AttemptTimeout: 10 * time.Second,
		PollInterval:   50 * time.Millisecond,
		Retry:          llmqtype.BackoffPolicy{Base: time.Minute, Cap: time.Minute},
	}
	if !e.Unadmitted {
		cfg.Admission = &lease.Admission{
			Limiter: e.Limiter,
			Route: func(j *jobs.Job) (admission.Request, bool) {
				return admission.Request{Pool: Pool, Tenant: j.Tenant, Tokens: Reserve}, true
			},
		}
	}
	runner, err := lease.NewRunner(e.db.Pool, e.store, cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	res, err := e.store.Enqueue(ctx, e.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "call", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	var attempt jobs.Attempt
	require.Eventually(t, func() bool {
		attempts, err := e.store.Attempts(ctx, e.db.Pool, "acme", res.Job.ID)
		require.NoError(t, err)
		if len(attempts) == 0 || attempts[0].EndedAt.IsZero() {
			return false
		}
		attempt = attempts[0]
		return true
	}, 20*time.Second, 20*time.Millisecond)
	return attempt
}

// State reads the pool's levels and cooldown.
func (e *Env) State(t *testing.T) admission.PoolState {
	t.Helper()
	s, err := e.Limiter.State(t.Context(), Pool)
	require.NoError(t, err)
	return s
}

// HTTPClient is an HTTP client of the test's own, its idle connections
// closed when the test ends (so no goroutine outlives it).
func HTTPClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// DroppingURL is a base URL whose server reads each request in full and
// then closes the connection without answering: a connection lost after
// the request was sent.
func DroppingURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}
