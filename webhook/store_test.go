package webhook_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

func TestEnqueueFansOutToSubscribedEnabledEndpoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	all, _ := f.register(ok)
	other, _, err := f.store.RegisterEndpoint(ctx, f.pool, webhook.EndpointParams{
		Tenant: tenant, URL: "https://erp.example.com/hook", EventTypes: []string{"invoice.other"},
	})
	require.NoError(t, err)
	disabled, _ := f.register(ok)
	_, err = f.store.DisableEndpoint(ctx, f.pool, tenant, disabled.ID, "testing")
	require.NoError(t, err)
	_, _, err = f.store.RegisterEndpoint(ctx, f.pool, webhook.EndpointParams{
		Tenant: "globex", URL: "https://globex.example.com/hook", EventTypes: []string{webhook.AllEvents},
	})
	require.NoError(t, err)

	ds := f.enqueue(webhook.Event{ID: "evt-1"})
	require.Len(t, ds, 1, "only the enabled endpoint subscribed to the type, of this tenant")
	d := ds[0]
	require.Equal(t, all.ID, d.EndpointID)
	job, err := f.jobs.Get(ctx, f.pool, tenant, d.JobID)
	require.NoError(t, err)
	require.Equal(t, webhook.Kind, job.Kind)
	require.Equal(t, webhook.DefaultQueue, job.Queue)
	require.Equal(t, all.ID.String(), job.GroupKey, "per-endpoint order")
	require.Equal(t, 10, job.MaxAttempts, "one attempt per schedule step")

	var body struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(d.Body, &body))
	require.Equal(t, "invoice.extract.completed", body.Type)
	require.JSONEq(t, `{"invoice":"inv-1"}`, string(body.Data))

	require.Empty(t, f.enqueue(webhook.Event{ID: "evt-1"}), "an event id reaches an endpoint once")
	require.Len(t, f.enqueue(webhook.Event{ID: "evt-2", Type: "invoice.other"}), 2)

	got, err := f.store.Delivery(ctx, f.pool, tenant, d.ID)
	require.NoError(t, err)
	require.Equal(t, d.Body, got.Body)
	_, err = f.store.Delivery(ctx, f.pool, "globex", d.ID)
	require.ErrorIs(t, err, webhook.ErrNotFound, "tenant-scoped")
	_, err = f.store.Endpoint(ctx, f.pool, "globex", other.ID)
	require.ErrorIs(t, err, webhook.ErrNotFound, "tenant-scoped")
}

func TestRegisterRefusesBadEndpoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	strict, err := webhook.NewStore(webhook.Config{Schema: f.schema, Jobs: f.jobs, Outbox: f.outbox})
	require.NoError(t, err)
	good := webhook.EndpointParams{Tenant: tenant, URL: "https://erp.example.com/hook", EventTypes: []string{"a"}}
	cases := map[string]func(p *webhook.EndpointParams){
		"no tenant":          func(p *webhook.EndpointParams) { p.Tenant = "" },
		"plain http":         func(p *webhook.EndpointParams) { p.URL = "http://erp.example.com/hook" },
		"metadata address":   func(p *webhook.EndpointParams) { p.URL = "https://169.254.169.254/" },
		"loopback":           func(p *webhook.EndpointParams) { p.URL = "https://[::1]/" },
		"decimal loopback":   func(p *webhook.EndpointParams) { p.URL = "https://2130706433/" },
		"credentials in URL": func(p *webhook.EndpointParams) { p.URL = "https://u:p@erp.example.com/" },
		"no event types":     func(p *webhook.EndpointParams) { p.EventTypes = nil },
		"unknown scheme":     func(p *webhook.EndpointParams) { p.Scheme = "v2" },
		"short secret":       func(p *webhook.EndpointParams) { p.Secret = []byte("short") },
	}
	for name, mutate := range cases {
		p := good
		mutate(&p)
		_, _, err := strict.RegisterEndpoint(t.Context(), f.pool, p)
		require.ErrorIs(t, err, webhook.ErrInvalidEndpoint, name)
	}
	eps, err := strict.ListEndpoints(t.Context(), f.pool, tenant)
	require.NoError(t, err)
	require.Empty(t, eps, "nothing was written")

	_, err = f.store.Enqueue(t.Context(), f.pool, tenant, webhook.Event{Type: "a", Payload: json.RawMessage(`{`)})
	require.ErrorIs(t, err, webhook.ErrInvalidEvent)
	_, err = f.store.Enqueue(t.Context(), f.pool, tenant, webhook.Event{Type: "", Payload: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, webhook.ErrInvalidEvent)

	_, err = webhook.NewStore(webhook.Config{Schema: f.schema, Jobs: f.jobs, Outbox: f.outbox, Queue: "nope"})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
	_, err = webhook.NewStore(webhook.Config{Schema: f.schema, Outbox: f.outbox})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
	// A schema other than the job store's is a configuration mistake; the
	// error says which schemas and what to do.
	_, err = webhook.NewStore(webhook.Config{Schema: "elsewhere", Jobs: f.jobs, Outbox: f.outbox})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
	require.ErrorContains(t, err, `Schema: is "elsewhere" but the job store's is "`+f.schema+`"`)
	require.ErrorContains(t, err, "give every llmq component the Schema")
}

func TestRotationSignsWithOldAndNewKeyDuringTheOverlap(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	var got []http.Header
	ep, oldKey := f.register(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Clone())
		w.WriteHeader(http.StatusNoContent)
	}))
	newKey, err := f.store.RotateSecret(ctx, f.pool, tenant, ep.ID, time.Hour)
	require.NoError(t, err)
	ep, err = f.store.Endpoint(ctx, f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Equal(t, []string{newKey.ID, oldKey.ID}, ep.KeyIDs, "both sign, newest first")

	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))
	require.Equal(t, jobs.StateSucceeded, f.await(d.JobID).State)
	require.Len(t, got, 1)
	for _, k := range []webhook.Key{oldKey, newKey} {
		v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{k}})
		require.NoError(t, err)
		_, err = v.Verify(got[0], d.Body)
		require.NoError(t, err, "a receiver with either key accepts during the overlap")
	}
	attempts := f.attempts(d.ID)
	require.Len(t, attempts, 1)
	require.Equal(t, []string{newKey.ID, oldKey.ID}, attempts[0].KeyIDs, "key ids recorded per attempt")

	// Zero overlap retires the old keys at once.
	newest, err := f.store.RotateSecret(ctx, f.pool, tenant, ep.ID, 0)
	require.NoError(t, err)
	ep, err = f.store.Endpoint(ctx, f.pool, tenant, ep.ID)
	require.NoError(t, err)
	require.Equal(t, []string{newest.ID}, ep.KeyIDs)
	_, err = f.store.RotateSecret(ctx, f.pool, "globex", ep.ID, 0)
	require.ErrorIs(t, err, webhook.ErrNotFound)
}

func TestPruneDeletesOldDeliveriesWithTheirAttempts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.register(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	old := f.enqueue(webhook.Event{ID: "old"})[0]
	fresh := f.enqueue(webhook.Event{ID: "fresh"})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))
	f.await(old.JobID)
	f.await(fresh.JobID)
	_, err := f.pool.Exec(t.Context(), "UPDATE "+f.schema+".webhook_deliveries SET created_at = now() - interval '31 days' WHERE id = $1", old.ID)
	require.NoError(t, err)

	n, err := f.store.Prune(t.Context(), f.pool, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, err = f.store.Delivery(t.Context(), f.pool, tenant, old.ID)
	require.ErrorIs(t, err, webhook.ErrNotFound)
	require.Empty(t, f.attempts(old.ID))
	require.Len(t, f.attempts(fresh.ID), 1, "recent deliveries stay")

	_, err = webhook.NewStore(webhook.Config{Schema: f.schema, Jobs: f.jobs, Outbox: f.outbox, Retention: time.Hour})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig, "shorter than the default schedule's span")
}

func TestEndpointSchemeAndKeyIDsReachTheWire(t *testing.T) {
	t.Parallel()
	f := setup(t)
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	_, key, err := f.store.RegisterEndpoint(t.Context(), f.pool, webhook.EndpointParams{
		Tenant: tenant, URL: srv.URL, EventTypes: []string{webhook.AllEvents}, Scheme: webhook.SchemeTimestampFirst, SendKeyIDs: true,
	})
	require.NoError(t, err)
	d := f.enqueue(webhook.Event{})[0]
	f.start(runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})}))
	h := <-got
	require.Equal(t, key.ID, h.Get(webhook.KeyIDHeader))
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}, Scheme: webhook.SchemeTimestampFirst})
	require.NoError(t, err)
	verified, err := v.Verify(h, d.Body)
	require.NoError(t, err)
	require.Equal(t, key.ID, verified.KeyID)
	require.Equal(t, d.ID.String(), verified.ID)
}
