package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

const tenant = "acme"

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}

type fixture struct {
	t      testing.TB
	pool   *pgxpool.Pool
	schema string
	jobs   *jobs.PostgresStore
	outbox *outbox.Store
	inbox  *inbox.Store
	store  *webhook.Store
	client *webhook.Client
}

// setup migrates a schema of the test's own and builds the stores, with a
// delivery schedule of schedule (default: 10 attempts 20ms apart) and a
// client that may reach loopback over plain http.
func setup(t testing.TB, schedule ...time.Duration) *fixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 16})
	js, err := jobs.NewStore(jobs.Config{Schema: db.Schema, Queues: []string{jobs.DefaultQueue, webhook.DefaultQueue}})
	require.NoError(t, err)
	ob, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	in, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	if len(schedule) == 0 {
		schedule = []time.Duration{0, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond,
			20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}
	}
	store, err := webhook.NewStore(webhook.Config{Schema: db.Schema, Jobs: js, Outbox: ob, Schedule: schedule, AllowHTTP: true, Allow: loopback})
	require.NoError(t, err)
	client, err := webhook.NewClient(webhook.ClientConfig{AllowHTTP: true, Allow: loopback, AttemptTimeout: 2 * time.Second})
	require.NoError(t, err)
	return &fixture{t: t, pool: db.Pool, schema: db.Schema, jobs: js, outbox: ob, inbox: in, store: store, client: client}
}

// register starts srv's handler on loopback and registers it for every
// event type.
func (f *fixture) register(h http.Handler) (*webhook.Endpoint, webhook.Key) {
	f.t.Helper()
	srv := httptest.NewServer(h)
	f.t.Cleanup(srv.Close)
	ep, key, err := f.store.RegisterEndpoint(f.t.Context(), f.pool, webhook.EndpointParams{
		Tenant: tenant, URL: srv.URL + "/hook", EventTypes: []string{webhook.AllEvents},
	})
	require.NoError(f.t, err)
	return ep, key
}

func (f *fixture) dispatcher(cfg webhook.DispatcherConfig) *webhook.Dispatcher {
	f.t.Helper()
	if cfg.Client == nil {
		cfg.Client = f.client
	}
	d, err := f.store.NewDispatcher(f.pool, cfg)
	require.NoError(f.t, err)
	return d
}

func runnerConfig(handlers map[string]lease.Handler) lease.Config {
	return lease.Config{
		Handlers:          handlers,
		Queues:            map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 4}, webhook.DefaultQueue: {MaxWorkers: 4}},
		LeaseDuration:     5 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		AttemptTimeout:    3 * time.Second,
		PollInterval:      20 * time.Millisecond,
		ReapInterval:      500 * time.Millisecond,
		ShutdownGrace:     2 * time.Second,
		RetryByKind:       map[string]llmqtype.BackoffPolicy{webhook.Kind: webhook.Backoff()},
		DeadlineMargin:    time.Second,
	}
}

// start runs a runner until the test ends or stop is called.
func (f *fixture) start(cfg lease.Config) func() {
	f.t.Helper()
	r, err := lease.NewRunner(f.pool, f.jobs, cfg)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			require.NoError(f.t, <-done)
		})
	}
	f.t.Cleanup(stop)
	return stop
}

func (f *fixture) enqueue(ev webhook.Event) []webhook.Delivery {
	f.t.Helper()
	if ev.Type == "" {
		ev.Type = "invoice.extract.completed"
	}
	if ev.Payload == nil {
		ev.Payload = json.RawMessage(`{"invoice":"inv-1"}`)
	}
	ds, err := f.store.Enqueue(f.t.Context(), f.pool, tenant, ev)
	require.NoError(f.t, err)
	return ds
}

// await waits until the job is terminal and returns it.
func (f *fixture) await(id uuid.UUID) *jobs.Job {
	f.t.Helper()
	var job *jobs.Job
	require.Eventually(f.t, func() bool {
		j, err := f.jobs.Get(context.Background(), f.pool, tenant, id)
		if err != nil {
			return false
		}
		job = j
		return j.State.Terminal()
	}, 20*time.Second, 10*time.Millisecond, "job %s did not finish", id)
	return job
}

func (f *fixture) attempts(deliveryID uuid.UUID) []webhook.Attempt {
	f.t.Helper()
	a, err := f.store.Attempts(f.t.Context(), f.pool, tenant, deliveryID)
	require.NoError(f.t, err)
	return a
}

// hits counts and timestamps the requests a test endpoint received.
type hits struct {
	mu    sync.Mutex
	times []time.Time
	ids   []string
}

func (h *hits) add(r *http.Request) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.times = append(h.times, time.Now())
	h.ids = append(h.ids, r.Header.Get(webhook.IDHeader))
	return len(h.times)
}

func (h *hits) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.times)
}

func (h *hits) at(i int) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.times[i]
}
