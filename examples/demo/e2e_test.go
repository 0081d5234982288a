package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmq/llmq/examples/internal/sample"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

type fixture struct {
	t     *testing.T
	s     *stack
	big   apiClient
	small apiClient
	ops   apiClient
}

// setup starts the whole pipeline on a schema of the test's own, with the
// provider's 15s mean latency scaled down to 50ms.
func setup(t *testing.T, cfg stackConfig) *fixture {
	t.Helper()
	db := freshSchema(t)
	cfg.Schema = db.Schema
	cfg.Scale = max(cfg.Scale, 300)
	cfg.ProviderRPM = max(cfg.ProviderRPM, 6000)
	cfg.Workers = max(cfg.Workers, 6)
	s, err := startStack(t.Context(), db.Pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.stop()) })
	for tenant, sups := range suppliers {
		for _, sup := range sups {
			require.NoError(t, s.svc.PutSupplier(t.Context(), tenant, sup))
		}
	}
	return &fixture{
		t: t, s: s,
		big:   apiClient{base: s.api.URL, token: bigToken},
		small: apiClient{base: s.api.URL, token: smallToken},
		ops:   apiClient{base: s.api.URL, token: operatorToken},
	}
}

func (f *fixture) upload(c apiClient, name, text string) invoice.Document {
	f.t.Helper()
	d, err := c.putDocument(f.t.Context(), name, text)
	require.NoError(f.t, err)
	return d
}

func (f *fixture) submit(c apiClient, key string, d invoice.Document) submitted {
	f.t.Helper()
	s, err := c.submit(f.t.Context(), key, d)
	require.NoError(f.t, err)
	return s
}

// waitTerminal waits for the job to reach a terminal state and returns it.
func (f *fixture) waitTerminal(c apiClient, id string) invoice.JobView {
	f.t.Helper()
	var v invoice.JobView
	require.Eventually(f.t, func() bool {
		status, got, err := c.get(f.t.Context(), "/extraction-jobs/"+id)
		require.NoError(f.t, err)
		require.Equal(f.t, http.StatusOK, status)
		v = got
		return v.FinishedAt != (time.Time{})
	}, 30*time.Second, 20*time.Millisecond, "job %s did not finish", id)
	return v
}

// duplicator sits in front of the ERP and sends every delivery twice, so that
// each delivery arrives as a duplicate: the ERP must book once.
type duplicator struct {
	target string
	mu     sync.Mutex
	ids    map[string]int
	second []int // status of each duplicate
}

// snapshot copies what the duplicator saw, so that no assertion runs
// under its lock.
func (d *duplicator) snapshot() (map[string]int, []int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.ids), slices.Clone(d.second)
}

func (d *duplicator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	send := func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.target+r.URL.Path, bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	first, err := send(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if first < 300 {
		second, err := send(r.Context())
		d.mu.Lock()
		d.ids[r.Header.Get("webhook-id")]++
		if err == nil {
			d.second = append(d.second, second)
		}
		d.mu.Unlock()
	}
	w.WriteHeader(first)
}

// The whole flow over HTTP: acceptance with idempotency (same key → same job,
// another request → 409), bad input naming its field, tenant quota → 429,
// tenant isolation, extraction through the provider with a malformed answer
// and a hung call retried, review-required results withheld from the ERP,
// a prompt injection changing nothing, an ERP outage ridden out, every
// delivery arriving twice and booked once, and the event stream replayed
// after a reconnect.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	f := setup(t, stackConfig{SmallQuota: 2})
	ctx := t.Context()

	// Every delivery reaches the ERP through the duplicator; the ERP is down
	// when the first deliveries go out.
	dup := &duplicator{target: f.s.erpSrv.URL, ids: map[string]int{}}
	proxy := httptest.NewServer(dup)
	t.Cleanup(proxy.Close)
	for _, tenant := range []string{bigTenant, smallTenant} {
		eps, err := f.s.svc.Webhooks.ListEndpoints(ctx, f.s.pool, tenant)
		require.NoError(t, err)
		require.Len(t, eps, 1)
		_, err = f.s.svc.Webhooks.DisableEndpoint(ctx, f.s.pool, tenant, eps[0].ID, "replaced by the test's proxy")
		require.NoError(t, err)
	}
	f.reRegister(proxy.URL)
	f.s.erp.SetDown(true)

	// The big tenant's stream, open before anything happens.
	streamCtx, closeStream := context.WithCancel(ctx)
	events, err := f.big.stream(streamCtx, "")
	require.NoError(t, err)

	nordwind, acme := suppliers[bigTenant][0], suppliers[bigTenant][1]
	docs := map[string]struct {
		tenant apiClient
		text   string
		review bool
	}{
		"good-1":    {f.big, sample.Invoice(nordwind, "NW-1", 1, plain), false},
		"good-2":    {f.big, sample.Invoice(acme, "AC-2", 2, plain), false},
		"copy-of-1": {f.big, sample.Invoice(nordwind, "NW-1", 1, plain), false},
		"malformed": {f.big, sample.Invoice(acme, "AC-3", 3, malformed), false},
		"hangs":     {f.big, sample.Invoice(nordwind, "NW-4", 4, hangs), false},
		"wrong":     {f.big, sample.Invoice(nordwind, "NW-5", 5, wrongIBAN), true},
		"total":     {f.big, sample.Invoice(acme, "AC-6", 6, badTotal), true},
		"inject":    {f.big, sample.Invoice(acme, "AC-7", 7, injection), true},
		"small-1":   {f.small, sample.Invoice(suppliers[smallTenant][0], "KK-1", 1, plain), false},
		"small-2":   {f.small, sample.Invoice(suppliers[smallTenant][0], "KK-2", 2, plain), false},
	}
	ids := map[string]string{}
	uploaded := map[string]invoice.Document{}
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		d := docs[name]
		uploaded[name] = f.upload(d.tenant, name, d.text)
		s := f.submit(d.tenant, "key-"+name, uploaded[name])
		require.Equal(t, http.StatusAccepted, s.Status, "%s: %s", name, s.Body)
		require.Equal(t, "/extraction-jobs/"+s.Job.JobID.String(), s.Location)
		require.Equal(t, s.Location, s.Job.StatusURL)
		ids[name] = s.Job.JobID.String()
	}
	// A copy under another name is the same content: same request, but a
	// new key makes it a new job (the ERP's own key books it once), which
	// takes the other's result rather than pay for it again.
	require.Equal(t, uploaded["good-1"].SHA256, uploaded["copy-of-1"].SHA256)

	// The same key and request again: the same job, 200.
	again := f.submit(f.big, "key-good-1", uploaded["good-1"])
	require.Equal(t, http.StatusOK, again.Status)
	require.Equal(t, ids["good-1"], again.Job.JobID.String())
	// The same key for another document: 409.
	conflict := f.submit(f.big, "key-good-1", uploaded["good-2"])
	require.Equal(t, http.StatusConflict, conflict.Status, "%s", conflict.Body)
	require.Contains(t, string(conflict.Body), `"field":"Idempotency-Key"`)

	// Bad input names the field.
	noKey := f.submit(f.big, "", uploaded["good-1"])
	require.Equal(t, http.StatusBadRequest, noKey.Status)
	require.Contains(t, string(noKey.Body), `"field":"Idempotency-Key"`)
	badDigest := uploaded["good-2"]
	badDigest.SHA256 = uploaded["good-1"].SHA256
	bd := f.submit(f.big, "key-bad-digest", badDigest)
	require.Equal(t, http.StatusUnprocessableEntity, bd.Status)
	require.Contains(t, string(bd.Body), `"field":"document.sha256"`)
	unknown, err := f.big.submitRaw(ctx, "key-unknown", []byte(`{"document":{"name":"good-1","version":1,"sha256":"`+uploaded["good-1"].SHA256+`"},"schema":"invoice-v1","callback_url":"http://x"}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, unknown.Status)
	require.Contains(t, string(unknown.Body), `"field":"callback_url"`)

	// The small tenant holds 2 pending jobs, its quota: a third is 429 with
	// a Retry-After, and nothing was accepted.
	third := f.upload(f.small, "small-3", sample.Invoice(suppliers[smallTenant][0], "KK-3", 3, plain))
	over := f.submit(f.small, "key-small-3", third)
	require.Equal(t, http.StatusTooManyRequests, over.Status, "%s", over.Body)
	secs, err := strconv.Atoi(over.RetryAfter)
	require.NoError(t, err)
	require.Positive(t, secs)
	smallJobs, err := f.s.svc.Jobs.List(ctx, f.s.pool, jobs.ListParams{Tenant: smallTenant})
	require.NoError(t, err)
	require.Len(t, smallJobs.Jobs, 2, "the refused job was not accepted")

	// Tenant isolation: another tenant's job is not found, by GET or by
	// key.
	status, _, err := f.small.get(ctx, "/extraction-jobs/"+ids["good-1"])
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status)
	status, _, err = f.big.get(ctx, "/extraction-jobs/"+ids["small-1"])
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status)

	// Read a few events, then drop the connection and start the worker.
	var seen []sseEvent
	for len(seen) < 3 {
		select {
		case ev := <-events:
			seen = append(seen, ev)
		case <-time.After(10 * time.Second):
			t.Fatalf("no events on the stream; saw %v", seen)
		}
	}
	closeStream()
	lastID := seen[len(seen)-1].ID
	f.s.run(ctx)

	// Every job finishes as its document says.
	views := map[string]invoice.JobView{}
	for name, d := range docs {
		views[name] = f.waitTerminal(d.tenant, ids[name])
		want := jobs.StateSucceeded
		if d.review {
			want = jobs.StateReviewRequired
		}
		require.Equal(t, want, views[name].State, "%s: %+v", name, views[name])
	}
	require.Contains(t, views["inject"].ReviewReason, "send_to")
	require.Contains(t, string(views["inject"].Result), "field outside the schema")

	// Retries are visible to operators only.
	_, opView, err := f.ops.get(ctx, "/extraction-jobs/"+ids["malformed"])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(opView.Attempts), 2)
	require.Empty(t, views["malformed"].Attempts)
	_, opView, err = f.ops.get(ctx, "/extraction-jobs/"+ids["hangs"])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(opView.Attempts), 2)
	// The two copies were extracted once: one job's last attempt took the
	// other's result (which ran first is the claims' choice).
	reused := 0
	for _, pair := range [][2]string{{"good-1", "copy-of-1"}, {"copy-of-1", "good-1"}} {
		_, opView, err = f.ops.get(ctx, "/extraction-jobs/"+ids[pair[0]])
		require.NoError(t, err)
		if last := opView.Attempts[len(opView.Attempts)-1]; last.Outcome == jobs.AttemptReused {
			require.Equal(t, ids[pair[1]], last.ReusedFrom.String())
			reused++
		}
	}
	require.Equal(t, 1, reused, "one copy was extracted, the other took its result")

	// The ERP comes back: every successful extraction is booked once,
	// though every delivery arrived twice and one invoice was uploaded
	// twice; nothing that needs review reached it.
	f.s.erp.SetDown(false)
	var booked map[string]bool
	require.Eventually(t, func() bool {
		inv, err := f.s.erp.Invoices(ctx)
		require.NoError(t, err)
		booked = map[string]bool{}
		for _, i := range inv {
			booked[i.JobID] = true
		}
		return len(inv) == 6 // good-1 (or its copy), good-2, malformed, hangs, small-1, small-2
	}, 30*time.Second, 50*time.Millisecond)
	for name, d := range docs {
		if d.review {
			require.False(t, booked[ids[name]], "%s needs review but was booked", name)
		}
	}
	require.NotEqual(t, booked[ids["good-1"]], booked[ids["copy-of-1"]], "exactly one of the two copies is booked")
	counts, err := f.s.erp.Counts(ctx)
	require.NoError(t, err)
	require.Positive(t, counts.RefusedDown, "the outage refused deliveries")
	require.Equal(t, int64(6), counts.Booked)
	require.Eventually(t, func() bool {
		counts, err = f.s.erp.Counts(ctx)
		require.NoError(t, err)
		return counts.Receipts == 7 // the six and the copy's delivery, which booked nothing
	}, 10*time.Second, 50*time.Millisecond)
	// The duplicate of the last delivery may still be on its way.
	var ids2 map[string]int
	var second []int
	require.Eventually(t, func() bool {
		ids2, second = dup.snapshot()
		return len(second) == 7
	}, 10*time.Second, 20*time.Millisecond)
	// Webhooks are at-least-once: a delivery whose answer came too late for
	// the dispatcher's timeout (two sends behind the duplicator, on a
	// loaded machine) is sent again. That is allowed, and the ERP booked it
	// once (above); what must hold is that the dispatcher recorded every
	// such send as an attempt, and a success only once.
	for id, n := range ids2 {
		if n == 1 {
			continue
		}
		deliveryID := uuid.MustParse(id)
		var atts []webhook.Attempt
		for _, tenant := range []string{bigTenant, smallTenant} {
			a, err := f.s.svc.Webhooks.Attempts(ctx, f.s.pool, tenant, deliveryID)
			require.NoError(t, err)
			atts = append(atts, a...)
		}
		require.GreaterOrEqual(t, len(atts), n, "delivery %s was sent %d times but has %d attempts", id, n, len(atts))
		succeeded := 0
		for _, a := range atts {
			if a.Outcome == "delivered" {
				succeeded++
			}
		}
		require.LessOrEqual(t, succeeded, 1, "delivery %s recorded as succeeded more than once: %+v", id, atts)
	}
	for _, st := range second {
		require.Equal(t, http.StatusOK, st, "a duplicate is acknowledged without a second effect")
	}

	// Reconnect with Last-Event-ID: the stream replays what followed it,
	// every retry and terminal event of the big tenant's jobs, each job's
	// state version rising, and nothing of the other tenant's.
	events, err = f.big.stream(ctx, lastID)
	require.NoError(t, err)
	all := slices.Clone(seen)
	terminal := map[string]bool{}
	bigJobs := 0
	for _, d := range docs {
		if d.tenant == f.big {
			bigJobs++
		}
	}
	for len(terminal) < bigJobs {
		select {
		case ev := <-events:
			require.Equal(t, "job.changed", ev.Event, "%+v", ev)
			all = append(all, ev)
			if jobs.State(ev.Data.State).Terminal() {
				terminal[ev.Data.JobID] = true
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("replay stopped at %d terminal events of %d", len(terminal), bigJobs)
		}
	}
	// The malformed answer's retry was announced before the job finished.
	require.True(t, slices.ContainsFunc(all, func(ev sseEvent) bool {
		return ev.Data.JobID == ids["malformed"] && ev.Data.Type == invoice.Kind+".retry_scheduled" &&
			ev.Data.State == string(jobs.StateRetryScheduled)
	}), "no retry event for the malformed answer's job")
	versions := map[string]int64{}
	for _, ev := range all {
		require.NotEqual(t, ids["small-1"], ev.Data.JobID)
		require.NotEqual(t, ids["small-2"], ev.Data.JobID)
		require.Greater(t, ev.Data.StateVersion, versions[ev.Data.JobID], "state_version went backwards for %s", ev.Data.JobID)
		versions[ev.Data.JobID] = ev.Data.StateVersion
	}

	// A cursor the stream cannot replay from tells the client to re-read the
	// snapshot.
	events, err = f.big.stream(ctx, "999999999")
	require.NoError(t, err)
	select {
	case ev := <-events:
		require.Equal(t, "reset", ev.Event)
	case <-time.After(5 * time.Second):
		t.Fatal("no reset event")
	}

	// A revoked token ends its stream.
	events, err = f.small.stream(ctx, "")
	require.NoError(t, err)
	f.s.auth.Revoke(smallToken)
	for ev := range events {
		if ev.Event == "revoked" {
			return
		}
	}
	t.Fatal("the stream ended without saying the token was revoked")
}

// reRegister registers each tenant's ERP endpoint at base (the proxy) with a
// new key the ERP verifies.
func (f *fixture) reRegister(base string) {
	f.t.Helper()
	u, err := url.Parse(base)
	require.NoError(f.t, err)
	for _, tenant := range []string{bigTenant, smallTenant} {
		_, key, err := f.s.svc.Webhooks.RegisterEndpoint(f.t.Context(), f.s.pool, webhookParams(tenant, u.String()+"/webhooks/"+tenant))
		require.NoError(f.t, err)
		require.NoError(f.t, f.s.erp.AddTenant(tenant, key))
	}
}

// System capacity is 503 with a Retry-After, a missing or unknown token 401,
// and retry details are for operators only.
func TestCapacityAndAuth(t *testing.T) {
	t.Parallel()
	f := setup(t, stackConfig{SystemMax: 1})
	ctx := t.Context()
	nordwind := suppliers[bigTenant][0]
	first := f.upload(f.big, "a", sample.Invoice(nordwind, "NW-1", 1, plain))
	second := f.upload(f.small, "b", sample.Invoice(suppliers[smallTenant][0], "KK-1", 1, plain))
	require.Equal(t, http.StatusAccepted, f.submit(f.big, "k1", first).Status)
	full := f.submit(f.small, "k2", second)
	require.Equal(t, http.StatusServiceUnavailable, full.Status, "%s", full.Body)
	require.Contains(t, string(full.Body), `"code":"capacity"`)
	require.NotEmpty(t, full.RetryAfter)

	stranger := apiClient{base: f.s.api.URL, token: "nobody"}
	s, err := stranger.submit(ctx, "k3", first)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, s.Status)
	status, _, err := f.big.get(ctx, "/extraction-jobs/not-a-uuid")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status)

	// The worker runs the job: usage and attempts are recorded, shown to
	// the operator and not to the tenant's own token.
	f.s.run(ctx)
	list, err := f.s.svc.Jobs.List(ctx, f.s.pool, jobs.ListParams{Tenant: bigTenant, Kind: invoice.Kind})
	require.NoError(t, err)
	require.Len(t, list.Jobs, 1)
	id := list.Jobs[0].ID.String()
	v := f.waitTerminal(f.big, id)
	require.Empty(t, v.Attempts)
	_, op, err := f.ops.get(ctx, "/extraction-jobs/"+id)
	require.NoError(t, err)
	require.NotEmpty(t, op.Attempts)
	last := op.Attempts[len(op.Attempts)-1]
	require.Positive(t, last.Usage.InputTokens)
	require.Positive(t, last.Usage.OutputTokens)
}

// A provider 429 storm: a refused call's Retry-After cools the shared pool
// down and snoozes its job without spending an attempt; every job succeeds
// once the storm passes.
func TestProviderStorm(t *testing.T) {
	t.Parallel()
	f := setup(t, stackConfig{})
	ctx := t.Context()
	nordwind := suppliers[bigTenant][0]
	var ids []string
	for i := range 6 {
		doc := f.upload(f.big, fmt.Sprintf("storm-%d", i), sample.Invoice(nordwind, fmt.Sprintf("NW-%d", i), i, plain))
		s := f.submit(f.big, fmt.Sprintf("k%d", i), doc)
		require.Equal(t, http.StatusAccepted, s.Status)
		ids = append(ids, s.Job.JobID.String())
	}
	// The storm's second starts at the first call, which under load may come
	// well after the runner starts.
	f.s.provider.StormFromNextCall(time.Second)
	f.s.run(ctx)
	snoozed := 0
	for _, id := range ids {
		v := f.waitTerminal(f.big, id)
		require.Equal(t, jobs.StateSucceeded, v.State)
		_, op, err := f.ops.get(ctx, "/extraction-jobs/"+id)
		require.NoError(t, err)
		for _, a := range op.Attempts {
			require.NotEqual(t, jobs.AttemptFailed, a.Outcome)
			if a.Outcome == jobs.AttemptSnoozed {
				snoozed++
			}
		}
	}
	st := f.s.provider.Stats()
	require.GreaterOrEqual(t, st.RateLimited, int64(1))
	// Each job is refused at most once: its snooze and the pool's cooldown
	// last the Retry-After, which outlasts the storm. (That the cooldown
	// holds back every worker is proved in package admission.)
	require.LessOrEqual(t, st.RateLimited, int64(len(ids)), "a job called into the storm twice")
	require.Positive(t, snoozed)
}

// A reconnect replays at most the window; a client further behind is told to
// re-read the snapshot.
func TestStreamWindow(t *testing.T) {
	t.Parallel()
	f := setup(t, stackConfig{Window: 2})
	ctx := t.Context()
	streamCtx, closeStream := context.WithCancel(ctx)
	events, err := f.big.stream(streamCtx, "")
	require.NoError(t, err)
	for i := range 4 {
		doc := f.upload(f.big, fmt.Sprintf("w-%d", i), sample.Invoice(suppliers[bigTenant][0], fmt.Sprintf("NW-%d", i), i, plain))
		require.Equal(t, http.StatusAccepted, f.submit(f.big, fmt.Sprintf("k%d", i), doc).Status)
	}
	var ids []string
	for len(ids) < 4 {
		select {
		case ev := <-events:
			ids = append(ids, ev.ID)
		case <-time.After(10 * time.Second):
			t.Fatalf("saw %d events of 4", len(ids))
		}
	}
	closeStream()

	// Two behind: replayed.
	streamCtx, closeStream = context.WithCancel(ctx)
	defer closeStream()
	events, err = f.big.stream(streamCtx, ids[1])
	require.NoError(t, err)
	for _, want := range ids[2:] {
		select {
		case ev := <-events:
			require.Equal(t, "job.changed", ev.Event)
			require.Equal(t, want, ev.ID)
		case <-time.After(10 * time.Second):
			t.Fatal("no replay")
		}
	}
	// Four behind: reset.
	events, err = f.big.stream(ctx, "0")
	require.NoError(t, err)
	select {
	case ev := <-events:
		require.Equal(t, "reset", ev.Event)
		require.Contains(t, ev.Raw, "replay window")
	case <-time.After(10 * time.Second):
		t.Fatal("no reset")
	}
}

// The event stream holds back at a gap in the outbox sequence while the
// transaction holding it may still commit, delivers that transaction's
// event first if it does, and moves on as soon as it rolled back, long
// before its fallback wait (an hour here).
func TestStreamHoldsBackAtGaps(t *testing.T) {
	t.Parallel()
	f := setup(t, stackConfig{GapWait: time.Hour})
	ctx := t.Context()
	events, err := f.big.stream(ctx, "")
	require.NoError(t, err)
	next := func() sseEvent {
		t.Helper()
		select {
		case ev := <-events:
			require.Equal(t, "job.changed", ev.Event, "%+v", ev)
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event on the stream")
			return sseEvent{}
		}
	}
	// hold writes a job event of the big tenant in a transaction left open,
	// taking a sequence number before the next acceptance's.
	hold := func() (pgx.Tx, string) {
		t.Helper()
		tx, err := f.s.pool.Begin(ctx)
		require.NoError(t, err)
		job := uuid.New()
		payload := fmt.Sprintf(`{"job_id":%q,"tenant":%q,"kind":%q,"state":"READY","state_version":1}`, job, bigTenant, invoice.Kind)
		_, err = f.s.svc.Outbox.Write(ctx, tx, outbox.Event{
			AggregateID: job, Topic: f.s.svc.Jobs.Config().EventTopic, Key: job.String(), Type: invoice.Kind + ".requested", Payload: []byte(payload),
		})
		require.NoError(t, err)
		return tx, job.String()
	}
	accept := func(i int) string {
		t.Helper()
		doc := f.upload(f.big, fmt.Sprintf("g-%d", i), sample.Invoice(suppliers[bigTenant][0], fmt.Sprintf("GP-%d", i), i, plain))
		sub := f.submit(f.big, fmt.Sprintf("gap-%d", i), doc)
		require.Equal(t, http.StatusAccepted, sub.Status)
		return sub.Job.JobID.String()
	}

	// The holder commits: its event comes first, then the later one.
	tx, held := hold()
	later := accept(1)
	select {
	case ev := <-events:
		t.Fatalf("the stream skipped past an open transaction's sequence number: %+v", ev)
	case <-time.After(time.Second):
	}
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, held, next().Data.JobID)
	require.Equal(t, later, next().Data.JobID)

	// The holder rolls back: the gap is for good, and the stream goes on.
	tx, _ = hold()
	later = accept(2)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, later, next().Data.JobID)
}

// One trace from the caller's request to the ERP: the caller's traceparent
// is continued by the acceptance span, and the extraction's attempt and the
// webhook delivery to the ERP join the same trace.
func TestOneTraceFromRequestToERP(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tracer.Shutdown(context.Background()) })
	f := setup(t, stackConfig{Tracer: tracer})
	ctx := t.Context()
	f.s.run(ctx)
	doc := f.upload(f.big, "traced", sample.Invoice(suppliers[bigTenant][0], "TR-1", 1, plain))
	body, err := json.Marshal(invoice.CreateRequest{Document: doc, Schema: invoice.SchemaV1})
	require.NoError(t, err)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp, err := f.big.do(ctx, http.MethodPost, "/extraction-jobs", http.Header{
		"Content-Type": {"application/json"}, "Idempotency-Key": {"traced-1"},
		"Traceparent": {"00-" + traceID + "-00f067aa0ba902b7-01"},
	}, body)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, resp.Status, string(resp.Body))
	var job invoice.JobView
	require.NoError(t, json.Unmarshal(resp.Body, &job))
	require.Equal(t, jobs.StateSucceeded, f.waitTerminal(f.big, job.JobID.String()).State)

	inTrace := func(name string) bool {
		for _, s := range spans.Ended() {
			if s.Name() == name && s.SpanContext().TraceID().String() == traceID {
				return true
			}
		}
		return false
	}
	require.True(t, inTrace("POST /extraction-jobs"), "the acceptance span continues the caller's trace")
	require.Eventually(t, func() bool { return inTrace("llmq.attempt " + invoice.Kind) }, 10*time.Second, 20*time.Millisecond,
		"the extraction's attempt joins the trace")
	require.Eventually(t, func() bool { return inTrace("webhook deliver") }, 10*time.Second, 20*time.Millisecond,
		"the delivery to the ERP joins the trace")
}
