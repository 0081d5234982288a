package invoice

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtest"
	"github.com/llmq/llmq/webhook"
)

// The same bytes uploaded again under another name and Idempotency-Key are
// extracted once: the second job takes the first one's result, recorded as
// reused and naming it, without a provider call; each job still gets its
// own result view and its own signed webhook, naming its own document.
// Another tenant's upload of the same bytes is extracted for that tenant.
func TestTheSameDocumentIsExtractedOncePerTenant(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	docA := p.putInvoice("tok-acme", "inv-a.txt")
	docB := p.putInvoice("tok-acme", "inv-b.txt")
	docG := p.putInvoice("tok-globex", "inv.txt")
	require.Equal(t, docA.SHA256, docB.SHA256)
	require.Equal(t, docA.SHA256, docG.SHA256)
	// Accepted before the worker starts, so the first is claimed first and
	// the second waits for it.
	first := p.submit("tok-acme", "upload-1", docA)
	second := p.submit("tok-acme", "upload-2", docB)
	other := p.submit("tok-globex", "upload-1", docG)
	p.run()
	p.hooks.waitFor(t, map[string]int{"acme": 2, "globex": 1})

	require.Equal(t, int64(2), p.provider.Stats().Calls, "one call for acme's two uploads, one for globex's")
	firstJob := p.succeeded("acme", first)
	require.Equal(t, uuid.Nil, firstJob.ReusedFrom)
	p.requireComputed("acme", first)
	secondJob := p.succeeded("acme", second)
	require.Equal(t, first, secondJob.ReusedFrom)
	require.JSONEq(t, string(firstJob.Result), string(secondJob.Result))
	attempts, err := p.svc.Jobs.Attempts(t.Context(), p.db.Pool, "acme", second)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptReused, attempts[0].Outcome)
	require.Equal(t, first, attempts[0].ReusedFrom)
	require.Zero(t, attempts[0].Usage.InputTokens, "no provider call, no usage")
	p.requireComputed("globex", other)

	// Each job's webhook is its own: its job, its document, the result.
	got := p.hooks.delivered()
	byJob := map[string]Delivered{}
	for _, d := range got["acme"] {
		byJob[d.JobID] = d
	}
	require.Len(t, byJob, 2)
	require.Equal(t, docA, byJob[first.String()].Document)
	require.Equal(t, docB, byJob[second.String()].Document)
	require.Equal(t, byJob[first.String()].Result, byJob[second.String()].Result)
	require.Equal(t, other.String(), got["globex"][0].JobID)
	require.Equal(t, docG, got["globex"][0].Document)
	require.Zero(t, p.hooks.unverified(), "every webhook was signed with its tenant's key")
}

// A changed IBAN on file invalidates the tenant's results: the same bytes
// are extracted and checked again, and now go to review, where a reused
// result would have passed against the old IBAN. Putting the same master
// data again invalidates nothing.
func TestASupplierChangeStopsReuse(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	p.run()
	first := p.submit("tok-acme", "upload-1", p.putInvoice("tok-acme", "inv-a.txt"))
	p.succeeded("acme", first)

	require.NoError(t, p.svc.PutSupplier(t.Context(), "acme", *nordwind))
	invalidations, err := p.svc.Jobs.ReuseInvalidations(t.Context(), p.db.Pool, Kind, 10)
	require.NoError(t, err)
	require.Empty(t, invalidations, "the same IBAN again changes nothing")
	require.NoError(t, p.svc.PutSupplier(t.Context(), "acme", Supplier{Name: nordwind.Name, IBAN: "GB29NWBK60161331926819"}))

	second := p.submit("tok-acme", "upload-2", p.putInvoice("tok-acme", "inv-b.txt"))
	job := p.finished("acme", second)
	require.Equal(t, jobs.StateReviewRequired, job.State, job.LastError)
	require.Equal(t, uuid.Nil, job.ReusedFrom)
	require.Equal(t, int64(2), p.provider.Stats().Calls)
}

// An extraction's reuse key is what decides its answer: the document's
// bytes, not its name or version; the model, schema and policy; and the
// lane, so that a synchronous job never waits behind a batch. It is the
// tenant's own, with the default TTL.
func TestExtractionReuseKey(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte(ocr))
	p := Payload{Document: Document{Name: "a.txt", Version: 1, SHA256: hex.EncodeToString(sum[:])}, Schema: SchemaV1, Policy: PolicyVersion, Model: Model}
	key := func(p Payload, queue string) string {
		t.Helper()
		r, err := extractionReuse(p, queue)
		require.NoError(t, err)
		require.False(t, r.Shared, "a tenant's key space")
		require.Zero(t, r.TTL, "the default TTL")
		return r.Key
	}
	base := key(p, Queue)
	renamed := p
	renamed.Document.Name, renamed.Document.Version = "copy-of-a.txt", 7
	require.Equal(t, base, key(renamed, Queue))
	for name, change := range map[string]func(*Payload){
		"content": func(p *Payload) { p.Document.SHA256 = strings.Repeat("0", 64) },
		"model":   func(p *Payload) { p.Model = "extract-large" },
		"policy":  func(p *Payload) { p.Policy = "invoice-policy/v2" },
		"schema":  func(p *Payload) { p.Schema = "invoice-v2" },
	} {
		changed := p
		change(&changed)
		require.NotEqual(t, base, key(changed, Queue), name)
	}
	require.NotEqual(t, base, key(p, BatchQueue), "each lane reuses its own results")
}

// pipeline is the service over HTTP with a worker against the fake
// provider, and an ERP stand-in that verifies each tenant's signed
// webhooks and keeps their bodies.
type pipeline struct {
	t           *testing.T
	svc         *Service
	db          *llmqtest.DB
	api         *httptest.Server
	provider    *fakeprovider.Server
	providerURL string
	hooks       *hookLog
}

// pipelineTokens are the pipeline's tenants, by bearer token.
var pipelineTokens = map[string]Credential{"tok-acme": {Tenant: "acme"}, "tok-globex": {Tenant: "globex"}}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	db := llmqtest.NewDB(t)
	svc, err := New(db.Pool, Config{Schema: db.Schema, Auth: NewAuth(pipelineTokens), AllowLoopback: true})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(t.Context()))
	p := &pipeline{t: t, svc: svc, db: db, hooks: &hookLog{verifiers: map[string]*webhook.Verifier{}, got: map[string][]Delivered{}}}
	p.api = httptest.NewServer(svc.Handler())
	t.Cleanup(p.api.Close)
	p.provider = fakeprovider.New(fakeprovider.Config{MeanLatency: time.Millisecond, RPM: 100_000})
	provider := httptest.NewServer(p.provider)
	t.Cleanup(provider.Close)
	p.providerURL = provider.URL + "/v1"
	erp := httptest.NewServer(p.hooks)
	t.Cleanup(erp.Close)
	for _, c := range pipelineTokens {
		require.NoError(t, svc.PutSupplier(t.Context(), c.Tenant, *nordwind))
		_, key, err := svc.Webhooks.RegisterEndpoint(t.Context(), db.Pool, webhook.EndpointParams{
			Tenant: c.Tenant, URL: erp.URL + "/" + c.Tenant, EventTypes: []string{CompletedEvent},
		})
		require.NoError(t, err)
		v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}})
		require.NoError(t, err)
		p.hooks.add(c.Tenant, v)
	}
	return p
}

// run starts the worker, which stops when the test ends.
func (p *pipeline) run() {
	p.t.Helper()
	runner, err := p.svc.NewRunner(p.t.Context(), WorkerConfig{
		ProviderURL: p.providerURL, APIKey: "key", Workers: 4, PollInterval: 50 * time.Millisecond,
		Limits: admission.Pool{RPM: 100_000, TPM: 100_000_000, MaxInFlight: 4}, ShutdownGrace: time.Second,
	})
	require.NoError(p.t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(p.t.Context()))
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()
	p.t.Cleanup(func() {
		cancel()
		require.NoError(p.t, <-done)
	})
}

// call sends a request as token's tenant and returns the status and body.
func (p *pipeline) call(token, method, path string, header http.Header, body []byte) (int, []byte) {
	p.t.Helper()
	req, err := http.NewRequestWithContext(p.t.Context(), method, p.api.URL+path, bytes.NewReader(body))
	require.NoError(p.t, err)
	req.Header = header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(p.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(p.t, err)
	return resp.StatusCode, data
}

// putInvoice uploads the test invoice (ocr) under name: every upload of
// these tests is the same bytes, which is what reuse is about.
func (p *pipeline) putInvoice(token, name string) Document {
	p.t.Helper()
	status, body := p.call(token, http.MethodPut, "/documents/"+name, nil, []byte(ocr))
	require.Equal(p.t, http.StatusCreated, status, "%s", body)
	var d Document
	require.NoError(p.t, json.Unmarshal(body, &d))
	return d
}

// submit asks for d's extraction under key and returns its job.
func (p *pipeline) submit(token, key string, d Document) uuid.UUID {
	p.t.Helper()
	status, body := p.call(token, http.MethodPost, "/extraction-jobs", http.Header{"Idempotency-Key": {key}},
		createBody(d.Name, d.Version, d.SHA256))
	require.Equal(p.t, http.StatusAccepted, status, "%s", body)
	var v JobView
	require.NoError(p.t, json.Unmarshal(body, &v))
	return v.JobID
}

// finished waits for the job to finish and returns it.
func (p *pipeline) finished(tenant string, id uuid.UUID) *jobs.Job {
	p.t.Helper()
	var j *jobs.Job
	require.Eventually(p.t, func() bool {
		var err error
		j, err = p.svc.Jobs.Get(p.t.Context(), p.db.Pool, tenant, id)
		require.NoError(p.t, err)
		return j.State.Terminal()
	}, 30*time.Second, 10*time.Millisecond, "job %s did not finish", id)
	return j
}

// succeeded waits for the job to finish, requires it SUCCEEDED, and
// returns it.
func (p *pipeline) succeeded(tenant string, id uuid.UUID) *jobs.Job {
	p.t.Helper()
	j := p.finished(tenant, id)
	require.Equal(p.t, jobs.StateSucceeded, j.State, j.LastError)
	return j
}

// requireComputed requires the job's one attempt to have called the
// provider and succeeded.
func (p *pipeline) requireComputed(tenant string, id uuid.UUID) {
	p.t.Helper()
	attempts, err := p.svc.Jobs.Attempts(p.t.Context(), p.db.Pool, tenant, id)
	require.NoError(p.t, err)
	require.Len(p.t, attempts, 1)
	require.Equal(p.t, jobs.AttemptSucceeded, attempts[0].Outcome)
	require.Equal(p.t, uuid.Nil, attempts[0].ReusedFrom)
	require.Positive(p.t, attempts[0].Usage.InputTokens, "a paid call")
}

// hookLog is an ERP stand-in at /{tenant}: it verifies each delivery with
// the tenant's key and keeps the completed extractions it was sent.
type hookLog struct {
	mu        sync.Mutex
	verifiers map[string]*webhook.Verifier
	got       map[string][]Delivered
	bad       int
}

func (h *hookLog) add(tenant string, v *webhook.Verifier) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.verifiers[tenant] = v
}

func (h *hookLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := strings.TrimPrefix(r.URL.Path, "/")
	body, err := io.ReadAll(r.Body)
	var event struct {
		Type string    `json:"type"`
		Data Delivered `json:"data"`
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.verifiers[tenant]
	if err == nil && v != nil {
		_, err = v.Verify(r.Header, body)
	}
	if err == nil {
		err = json.Unmarshal(body, &event)
	}
	if err != nil || v == nil || event.Type != CompletedEvent {
		h.bad++
		http.Error(w, "not a verified delivery", http.StatusUnauthorized)
		return
	}
	h.got[tenant] = append(h.got[tenant], event.Data)
	w.WriteHeader(http.StatusNoContent)
}

// waitFor waits until each tenant has had its number of deliveries.
func (h *hookLog) waitFor(t *testing.T, want map[string]int) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := h.delivered()
		for tenant, n := range want {
			if len(got[tenant]) < n {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "deliveries: want %v", want)
}

func (h *hookLog) delivered() map[string][]Delivered {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string][]Delivered, len(h.got))
	for tenant, ds := range h.got {
		out[tenant] = append([]Delivered(nil), ds...)
	}
	return out
}

func (h *hookLog) unverified() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bad
}
