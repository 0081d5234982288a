package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/erp"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/examples/internal/serve"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/examples/localserver"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/providerbatch"
	"github.com/llmq/llmq/webhook"
)

// The provider pool, and its prices in micro-dollars a million tokens.
const (
	poolName    = "fake-provider"
	inputPrice  = 2_500_000
	outputPrice = 10_000_000
)

// The demo's tenants and their bearer tokens.
const (
	bigTenant     = "globex"
	smallTenant   = "initech"
	bigToken      = "tok-globex"
	smallToken    = "tok-initech"
	operatorToken = "tok-ops-globex"
)

// stackConfig sizes the pipeline.
type stackConfig struct {
	Schema      string
	Scale       float64 // provider latency divisor
	ProviderRPM int
	Workers     int
	SmallQuota  int64 // the small tenant's pending-job quota (0: none)
	SystemMax   int64
	Window      int           // the event stream's replay window (0: the default)
	GapWait     time.Duration // the event stream's longest hold at a gap (0: the default)
	// Tracer, when set, traces acceptance and work (tests).
	Tracer trace.TracerProvider
	// LocalKVTokens, when set, puts the fake provider's API, quotas and
	// faults in front of a simulated local inference server
	// (examples/localserver) with a KV cache of this many tokens: the
	// answers' latency is its engine's, and the worker's pool has the
	// same in-flight token budget (-provider local).
	LocalKVTokens int64
	// BatchLane runs the service's batch lane: documents needed two days
	// ahead go through the fake provider's Batch API, served by a
	// providerbatch submitter (-deferrable).
	BatchLane bool
	// Broker names the broker carrying the job events ("" or "none": no
	// broker). With one, the runner does not LISTEN: the events' consumer
	// wakes it (see signals).
	Broker string
}

// stack is the whole pipeline in one process: the fake provider, the API,
// the worker (runner) and the ERP, each on its own loopback HTTP server, on
// one database schema.
type stack struct {
	schema   string
	pool     *pgxpool.Pool
	auth     *invoice.Auth
	svc      *invoice.Service
	provider *fakeprovider.Server
	calls    *callLog            // the provider's own record of the calls it served
	local    *localserver.Server // with -provider local: the engine behind the provider
	erp      *erp.ERP
	api      *httptest.Server
	provSrv  *httptest.Server
	erpSrv   *httptest.Server
	runner   *lease.Runner
	batch    *providerbatch.Submitter // with BatchLane
	// relay sends the uploads' webhooks when no broker carries the
	// events; with one, signals' relay does (see startSignals).
	relay   *outbox.Relay
	cancel  context.CancelFunc
	done    chan error
	started int // goroutines that answer on done
	stop    func() error
}

// startStack migrates the schema, starts every server and the runner, and
// registers each tenant's ERP endpoint; run starts the worker, stop shuts it
// all down.
func startStack(ctx context.Context, pool *pgxpool.Pool, cfg stackConfig) (*stack, error) {
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: cfg.Schema}); err != nil {
		return nil, err
	}
	auth := invoice.NewAuth(map[string]invoice.Credential{
		bigToken:      {Tenant: bigTenant},
		smallToken:    {Tenant: smallTenant},
		operatorToken: {Tenant: bigTenant, Operator: true},
	})
	svc, err := invoice.New(pool, invoice.Config{
		Schema: cfg.Schema, Auth: auth, AllowLoopback: true, BatchLane: cfg.BatchLane,
		SystemMaxPendingJobs: cfg.SystemMax, QuotaRetry: 2 * time.Second, ReplayWindow: cfg.Window, StreamGapWait: cfg.GapWait, TracerProvider: cfg.Tracer,
		// Short delivery retries, so an ERP outage of seconds is ridden out
		// in seconds; production keeps webhook.DefaultSchedule().
		WebhookSchedule: []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second, 2 * time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second},
	})
	if err != nil {
		return nil, err
	}
	if err := svc.Migrate(ctx); err != nil {
		return nil, err
	}
	if cfg.SmallQuota > 0 {
		if err := svc.SetTenantQuota(ctx, smallTenant, admission.TenantQuota{MaxPendingJobs: cfg.SmallQuota}); err != nil {
			return nil, err
		}
	}
	e, err := erp.New(pool, erp.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	if err := e.Migrate(ctx); err != nil {
		return nil, err
	}
	s := &stack{schema: cfg.Schema, pool: pool, auth: auth, svc: svc, erp: e, calls: &callLog{}}
	pcfg := fakeprovider.Config{Scale: cfg.Scale, RPM: cfg.ProviderRPM, TPM: 2_000_000, OnCall: s.calls.add}
	if cfg.LocalKVTokens > 0 {
		s.local = localserver.New(localserver.Config{KVTokens: cfg.LocalKVTokens, Scale: cfg.Scale})
		pcfg.Latency = func(ctx context.Context, prompt, maxTokens int64) error {
			_, err := s.local.Generate(ctx, prompt, maxTokens)
			return err
		}
	}
	s.provider = fakeprovider.New(pcfg)
	s.provSrv = newServer(s.provider)
	s.erpSrv = newServer(e)
	s.api = newServer(svc.Handler())
	closeAll := func() {
		s.api.Close()
		s.erpSrv.Close()
		s.provSrv.Close()
		if s.local != nil {
			s.local.Close()
		}
	}
	for _, tenant := range []string{bigTenant, smallTenant} {
		_, key, err := svc.Webhooks.RegisterEndpoint(ctx, pool, webhookParams(tenant, s.erpSrv.URL+"/webhooks/"+tenant))
		if err == nil {
			err = e.AddTenant(tenant, key)
		}
		if err != nil {
			closeAll()
			return nil, err
		}
	}
	runner, err := svc.NewRunner(ctx, invoice.WorkerConfig{
		ProviderURL: s.provSrv.URL + "/v1",
		Pool:        poolName,
		// The limiter holds the workers to the provider's own limits; the
		// provider's clock and buckets are not the limiter's, so a few 429s
		// still come back, and cool the pool down for every worker.
		// Prices of a large model ($2.50 and $10 a million tokens), so the
		// usage ledger shows what each lane cost; the batch price is left
		// at its default, half.
		Limits: admission.Pool{RPM: cfg.ProviderRPM, TPM: 1_800_000, MaxInFlight: cfg.Workers, MaxInFlightTokens: cfg.LocalKVTokens,
			InputPrice: inputPrice, OutputPrice: outputPrice},
		Workers:         cfg.Workers,
		AttemptTimeout:  2 * time.Second,
		Retry:           llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second},
		WebhookTimeout:  time.Second,
		BreakerCooldown: 500 * time.Millisecond,
		PollInterval:    100 * time.Millisecond,
		ShutdownGrace:   2 * time.Second,
		DisableListen:   cfg.Broker != "" && cfg.Broker != "none",
		TracerProvider:  cfg.Tracer,
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	s.runner = runner
	if cfg.BatchLane {
		// The fake's batches take 10 minutes divided by Scale; polled
		// often enough to see them end within a second of it.
		if s.batch, err = svc.NewBatchSubmitter(invoice.BatchConfig{
			ProviderURL: s.provSrv.URL + "/v1", Pool: poolName, ID: "demo",
			GatherInterval: 500 * time.Millisecond, PollMin: 250 * time.Millisecond, PollMax: time.Second,
			Retry: llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second},
		}); err != nil {
			closeAll()
			return nil, err
		}
	}
	if cfg.Broker == "" || cfg.Broker == "none" {
		if s.relay, err = svc.NewEventRelay(nil, outbox.RelayConfig{PollInterval: 100 * time.Millisecond}); err != nil {
			closeAll()
			return nil, err
		}
	}
	s.stop = func() error {
		var err error
		if s.cancel != nil {
			s.cancel()
			for range s.started {
				err = errors.Join(err, <-s.done)
			}
		}
		closeAll()
		return err
	}
	return s, nil
}

// run starts the worker (and the relay of the uploads' webhooks, without a
// broker): until then, accepted jobs wait.
func (s *stack) run(ctx context.Context) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	s.done = make(chan error, 3)
	started := 1
	if s.relay != nil {
		started++
		go func() { s.done <- s.relay.Run(runCtx) }()
	}
	if s.batch != nil {
		started++
		go func() { s.done <- s.batch.Run(runCtx) }()
	}
	s.started = started
	go func() { s.done <- s.runner.Run(runCtx) }()
}

// callLog is the fake provider's record of every call it served, in a
// batch or not, as it saw each one end (fakeprovider.Config.OnCall): the
// provider's side of the bill, which the demo checks against the
// documents it submitted, independently of llmq's own tables.
type callLog struct {
	mu    sync.Mutex
	calls []fakeprovider.Call
}

func (l *callLog) add(c fakeprovider.Call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

func (l *callLog) all() []fakeprovider.Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// webhookParams registers the ERP's URL for tenant's completed extractions
// and finished uploads.
func webhookParams(tenant, url string) webhook.EndpointParams {
	return webhook.EndpointParams{Tenant: tenant, URL: url, EventTypes: []string{invoice.CompletedEvent, invoice.BatchCompletedEvent}}
}

// newServer serves h on a loopback port (httptest's, which is what the demo
// needs too: real HTTP over a real socket), with the examples' server
// limits.
func newServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	serve.Limits{}.Apply(srv.Config)
	srv.Start()
	return srv
}
