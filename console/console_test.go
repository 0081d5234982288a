package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

// Every page answers 200 with what it is about.
func TestPagesRender(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	for path, want := range map[string][]string{
		"/":                                {"Live work by queue", "extraction", "Finished per minute", "Unpublished events", "worker-a", "outbox relay"},
		"/tenants":                         {"acme", "globex", "Running / cap"},
		"/jobs":                            {"invoice.extract", "webhook.deliver", "acme", "globex"},
		"/jobs?state=FAILED_TERMINAL":      {"FAILED_TERMINAL", "permanent"},
		"/dead":                            {"Dead letters", "FAILED_TERMINAL", "provider answered 400"},
		"/dead?state=REVIEW_REQUIRED":      {"REVIEW_REQUIRED", "the total does not match"},
		"/pools":                           {"openai-gpt", "Usage and cost per tenant per day", "acme"},
		"/batches":                         {"Provider batches", "openai-gpt", "anthropic-claude", "batch_abc123", "in_progress"},
		"/reuse":                           {"Result reuse", "Invalidations", "No invalidations."},
		"/jobs/" + f.dead["acme"].String(): {"FAILED_TERMINAL", "permanent", "worker-a", "uncertain", "invoice.extract.dead_lettered", "ocr-pages"},
	} {
		code, body := get(t, h, path)
		require.Equal(t, http.StatusOK, code, path)
		for _, w := range want {
			require.Contains(t, body, w, path)
		}
		require.NotContains(t, body, "csrf_token", "%s: a read-only console has no action forms", path)
	}
}

// Bad input is refused with a 400 (or 404 for what does not exist) whose
// message names the field, and nothing is queried with it.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	longPool := strings.Repeat("p", 201)
	for target, want := range map[string]string{
		"/jobs?state=DONE":                       "state: ",
		"/jobs?queue=no%20spaces":                "queue: ",
		"/jobs?kind=" + strings.Repeat("k", 101): "kind: ",
		"/jobs?tenant=%00x":                      "tenant: ",
		"/jobs?from=yesterday":                   "from: ",
		"/jobs?to=2026-13-01":                    "to: ",
		"/jobs?from=2026-02-01&to=2026-01-01":    "to: must be after from",
		"/jobs?limit=0":                          "limit: ",
		"/jobs?limit=x":                          "limit: ",
		"/jobs?before=not-a-uuid":                "before: ",
		"/jobs/12345":                            "id: ",
		"/dead?state=SUCCEEDED":                  "state: ",
		"/dead?at=x":                             "at: ",
		"/?fragment=nope":                        "fragment: ",
		"/?fragment=../x":                        "fragment: ",
		// Values PostgreSQL text cannot hold are refused before any
		// statement runs, whichever parameter carries them.
		"/tenants?after_tenant=%ff":                "after_tenant: ",
		"/tenants?after_queue=%00":                 "after_queue: ",
		"/tenants?after_queue=no%20spaces":         "after_queue: ",
		"/pools?after=%ff":                         "after: ",
		"/pools?after=a%00":                        "after: ",
		"/jobs?unknown=%ff":                        "unknown: ",
		"/dead?kind=%c3":                           "kind: ",
		"/jobs?flash=" + strings.Repeat("x", 5000): "flash: ",
		"/batches?pool=a%01b":                      "pool: ",
		"/batches?pool=" + longPool:                "pool: ",
		"/batches?pool=%ff":                        "pool: ",
		"/batches?limit=0":                         "limit: ",
		"/batches?limit=501":                       "limit: ",
		"/reuse?kind=no%20spaces":                  "kind: ",
		"/reuse?kind=%ff":                          "kind: ",
		"/reuse?limit=0":                           "limit: ",
		"/reuse?limit=501":                         "limit: ",
		"/reuse?recorded=1":                        "covered: ",
	} {
		code, body := get(t, h, target)
		require.Equal(t, http.StatusBadRequest, code, target)
		require.Contains(t, body, want, target)
	}
	code, body := get(t, h, "/jobs/"+uuid.NewString())
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "no such job")
	code, _ = get(t, h, "/nowhere")
	require.Equal(t, http.StatusNotFound, code)
	// A link cannot put its own words on a page.
	code, body = get(t, h, "/?flash=Your+session+expired%2C+sign+in+at+evil.example")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "evil.example")
}

// Without EnableActions the console only reads: the replay and pool
// forms are absent and their endpoints refuse.
func TestReadOnlyByDefault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := &session{t: t, h: f.console(t, console.Config{})}
	_, body := s.get("/jobs/" + f.dead["acme"].String())
	require.NotContains(t, body, "replay-form")
	rec := s.post("/jobs/"+f.dead["acme"].String()+"/replay", url.Values{"reason": {"x"}}, nil)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Contains(t, rec.Body.String(), "read-only")
	rec = s.post("/pools/openai-gpt", url.Values{"rpm": {"1"}}, nil)
	require.Equal(t, http.StatusForbidden, rec.Code)
	f.requireNoReplay(t, f.dead["acme"])
	rec = s.post("/batches/"+f.batches["submitted"].String()+"/cancel", url.Values{}, nil)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Contains(t, rec.Body.String(), "read-only")
	require.False(t, f.cancelRequested(t, f.batches["submitted"]))
	_, body = s.get("/reuse")
	require.NotContains(t, body, "invalidate-form")
	rec = s.post("/reuse/invalidate", url.Values{"kind": {"invoice.extract"}, "reason": {"x"}}, nil)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Contains(t, rec.Body.String(), "read-only")
	require.Empty(t, f.invalidations(t))
}

// An action without the page's CSRF token, with another's token, or sent
// from another site is refused, and writes nothing.
func TestCSRFRefusal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{EnableActions: true})
	target := "/jobs/" + f.dead["acme"].String() + "/replay"
	user := http.Header{"X-Test-User": {"ops@example.com"}}

	s := &session{t: t, h: h}
	_, body := s.get("/jobs/" + f.dead["acme"].String())
	token := csrfFrom(t, body)
	other := &session{t: t, h: h}
	_, otherBody := other.get("/jobs/" + f.dead["acme"].String())
	otherToken := csrfFrom(t, otherBody)
	require.NotEqual(t, token, otherToken)

	noCookie := &session{t: t, h: h}
	for name, c := range map[string]struct {
		s      *session
		form   url.Values
		header http.Header
		want   string
	}{
		"no token":        {s, url.Values{"reason": {"r"}}, user, "no CSRF token"},
		"another's token": {s, url.Values{"reason": {"r"}, "csrf_token": {otherToken}}, user, "does not match"},
		"no cookie":       {noCookie, url.Values{"reason": {"r"}, "csrf_token": {token}}, user, "no CSRF cookie"},
		"cross-site":      {s, url.Values{"reason": {"r"}, "csrf_token": {token}}, http.Header{"X-Test-User": user["X-Test-User"], "Sec-Fetch-Site": {"cross-site"}}, "another site"},
		"same-site":       {s, url.Values{"reason": {"r"}, "csrf_token": {token}}, http.Header{"X-Test-User": user["X-Test-User"], "Sec-Fetch-Site": {"same-site"}, "Origin": {"https://other.example.com"}}, "another site"},
		"foreign origin":  {s, url.Values{"reason": {"r"}, "csrf_token": {token}}, http.Header{"X-Test-User": user["X-Test-User"], "Origin": {"https://evil.example"}}, "another site or origin"},
	} {
		rec := c.s.post(target, c.form, c.header)
		require.Equal(t, http.StatusForbidden, rec.Code, name)
		require.Contains(t, rec.Body.String(), "csrf: ", name)
		require.Contains(t, rec.Body.String(), c.want, name)
	}
	// Who is acting must be known.
	rec := s.post(target, url.Values{"reason": {"r"}, "csrf_token": {token}}, nil)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Contains(t, rec.Body.String(), "actor: ")
	f.requireNoReplay(t, f.dead["acme"])
}

// A replay creates a new job linked to the dead one, recording who and
// why; repeating it returns that job; "again" makes another. The dead job
// is unchanged. A missing reason is a 400 naming it.
func TestReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{EnableActions: true})
	s := &session{t: t, h: h}
	dead := f.dead["globex"]
	before, err := f.store.Lookup(t.Context(), f.pool, dead)
	require.NoError(t, err)
	_, body := s.get("/jobs/" + dead.String())
	token := csrfFrom(t, body)
	user := http.Header{"X-Test-User": {"ops@example.com"}}
	target := "/jobs/" + dead.String() + "/replay"

	rec := s.post(target, url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "reason: ")
	f.requireNoReplay(t, dead)

	first := replayed(t, s.post(target, url.Values{"csrf_token": {token}, "reason": {"provider fixed"}}, user))
	job, err := f.store.Lookup(t.Context(), f.pool, first)
	require.NoError(t, err)
	require.Equal(t, dead, job.ReplayOf)
	require.Equal(t, "ops@example.com", job.ReplayedBy)
	require.Equal(t, "provider fixed", job.ReplayReason)
	require.Equal(t, "globex", job.Tenant)

	again := replayed(t, s.post(target, url.Values{"csrf_token": {token}, "reason": {"double click"}}, user))
	require.Equal(t, first, again, "a second replay returns the first")
	another := replayed(t, s.post(target, url.Values{"csrf_token": {token}, "reason": {"once more"}, "again": {"on"}}, user))
	require.NotEqual(t, first, another)

	after, err := f.store.Lookup(t.Context(), f.pool, dead)
	require.NoError(t, err)
	require.Equal(t, before.StateVersion, after.StateVersion, "the dead job is unchanged")

	_, page := s.get("/jobs/" + dead.String())
	require.Contains(t, page, "Replayed as")
	require.Contains(t, page, first.String())
	_, page = s.get("/jobs/" + first.String())
	require.Contains(t, page, "ops@example.com")
	require.Contains(t, page, "provider fixed")

	// A job that is not finished cannot be replayed.
	rec = s.post("/jobs/"+f.running.String()+"/replay", url.Values{"csrf_token": {token}, "reason": {"x"}}, user)
	require.Equal(t, http.StatusConflict, rec.Code)

	// Nor, from the console, a cancelled one: it replays dead letters and
	// reviews only, as EnableActions says.
	res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "globex", Kind: "webhook.deliver", Queue: "default", Payload: []byte(`{}`)})
	require.NoError(t, err)
	cancelled, err := f.store.Cancel(t.Context(), f.pool, "globex", res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateCancelled, cancelled.State)
	_, page = s.get("/jobs/" + cancelled.ID.String())
	require.NotContains(t, page, "replay-form", "no replay is offered for a cancelled job")
	rec = s.post("/jobs/"+cancelled.ID.String()+"/replay", url.Values{"csrf_token": {token}, "reason": {"x"}}, user)
	require.Equal(t, http.StatusConflict, rec.Code)
	require.Contains(t, rec.Body.String(), "REVIEW_REQUIRED")
	f.requireNoReplay(t, cancelled.ID)
}

var replayTarget = regexp.MustCompile(`/jobs/([0-9a-f-]{36})\?flash=`)

func replayed(t *testing.T, rec interface {
	Result() *http.Response
}) uuid.UUID {
	t.Helper()
	res := rec.Result()
	defer res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	m := replayTarget.FindStringSubmatch(res.Header.Get("Location"))
	require.NotNil(t, m, res.Header.Get("Location"))
	return uuid.MustParse(m[1])
}

func (f *fixture) requireNoReplay(t *testing.T, id uuid.UUID) {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".jobs WHERE replay_of = $1", id).Scan(&n))
	require.Zero(t, n, "no replay was written")
}

// A console mounted for one tenant shows nothing of another: not its
// jobs, rows, usage or dead letters; another tenant's job is not found,
// cannot be replayed, and filtering for it is refused.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{Tenant: "acme", EnableActions: true})
	s := &session{t: t, h: h}
	for _, path := range []string{"/", "/tenants", "/jobs", "/jobs?state=FAILED_TERMINAL", "/dead", "/dead?state=REVIEW_REQUIRED",
		"/pools", "/jobs/" + f.dead["acme"].String(), "/?fragment=live", "/tenants?fragment=rows", "/batches", "/reuse"} {
		code, body := s.get(path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "globex", path)
		require.NotContains(t, body, "anthropic-claude", "%s: provider batches are shared infrastructure", path)
		require.NotContains(t, body, `href="/batches"`, "%s: a tenant's console has no batches page in its navigation", path)
		require.NotContains(t, body, f.dead["globex"].String(), path)
		require.NotContains(t, body, "openai-gpt", "%s: pools are shared infrastructure", path)
	}
	for _, path := range []string{"/", "/?fragment=live"} {
		_, body := s.get(path)
		require.NotContains(t, body, "worker-a", "%s: runners are shared infrastructure", path)
		require.NotContains(t, body, "Unpublished events", "%s: the outbox is shared infrastructure", path)
	}
	_, body := s.get("/jobs")
	require.Contains(t, body, "acme")
	for _, path := range []string{"/jobs/" + f.dead["globex"].String(), "/jobs/" + f.review["globex"].String()} {
		code, _ := s.get(path)
		require.Equal(t, http.StatusNotFound, code, path)
	}
	for _, path := range []string{"/jobs?tenant=globex", "/dead?tenant=globex", "/tenants?tenant=globex"} {
		code, _ := s.get(path)
		require.Equal(t, http.StatusForbidden, code, path)
	}
	_, page := s.get("/jobs/" + f.dead["acme"].String())
	token := csrfFrom(t, page)
	user := http.Header{"X-Test-User": {"acme-admin"}}
	rec := s.post("/jobs/"+f.dead["globex"].String()+"/replay", url.Values{"csrf_token": {token}, "reason": {"x"}}, user)
	require.Equal(t, http.StatusNotFound, rec.Code)
	f.requireNoReplay(t, f.dead["globex"])
	rec = s.post("/pools/openai-gpt", url.Values{"csrf_token": {token}, "rpm": {"1"}}, user)
	require.Equal(t, http.StatusForbidden, rec.Code)
	rec = s.post("/batches/"+f.batches["submitted"].String()+"/cancel", url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.False(t, f.cancelRequested(t, f.batches["submitted"]))
	// Its own dead letter it may replay.
	replayed(t, s.post("/jobs/"+f.dead["acme"].String()+"/replay", url.Values{"csrf_token": {token}, "reason": {"ours"}}, user))
}

// With actions on, an operator changes a pool's limits; bad values are a
// 400 naming the field and change nothing.
func TestPoolEdit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := &session{t: t, h: f.console(t, console.Config{EnableActions: true})}
	_, body := s.get("/pools")
	token := csrfFrom(t, body)
	user := http.Header{"X-Test-User": {"ops"}}
	for field, value := range map[string]string{"rpm": "fast", "tpm": "-1", "max_in_flight": "0", "token_burst": "1e9"} {
		rec := s.post("/pools/openai-gpt", url.Values{"csrf_token": {token}, field: {value}}, user)
		require.Equal(t, http.StatusBadRequest, rec.Code, field)
		norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "") }
		require.Contains(t, norm(rec.Body.String()), norm(field)+": ", field)
	}
	rec := s.post("/pools/none", url.Values{"csrf_token": {token}, "rpm": {"5"}}, user)
	require.Equal(t, http.StatusNotFound, rec.Code)
	rec = s.post("/pools/openai-gpt", url.Values{"csrf_token": {token}, "rpm": {"1200"}, "max_in_flight": {"16"}, "max_in_flight_tokens": {"64000"},
		"batch_output_price": {"4000000"}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	var rpm, inFlight, inFlightTokens, batchIn, batchOut int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT rpm, max_in_flight, max_in_flight_tokens, batch_input_price, batch_output_price FROM "+f.schema+".admission_pools WHERE name = 'openai-gpt'").
		Scan(&rpm, &inFlight, &inFlightTokens, &batchIn, &batchOut))
	require.Equal(t, 1200, rpm)
	require.Equal(t, 16, inFlight)
	require.Equal(t, 64000, inFlightTokens)
	require.Zero(t, batchIn, "a batch price left empty keeps its value")
	require.Equal(t, 4_000_000, batchOut)
	_, body = s.get("/pools")
	require.Contains(t, body, "0 / 64,000", "the pool's tokens in flight against its budget")
}

// Listings page with cursors; a filter that matches little stops at the
// scan limit and offers to continue, and continuing finds the rest.
func TestPagination(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{ScanLimit: 3})
	seen := map[string]bool{}
	next := "/jobs?limit=2"
	for pages := 0; next != ""; pages++ {
		require.Less(t, pages, 20, next)
		code, body := get(t, h, next)
		require.Equal(t, http.StatusOK, code, next)
		for _, m := range jobLink.FindAllStringSubmatch(body, -1) {
			seen[m[1]] = true
		}
		next = nextLink(body)
	}
	require.Len(t, seen, 14, "every job once")

	// The two FAILED_TERMINAL jobs (one per tenant), found across windows.
	dead := map[string]bool{}
	next = "/jobs?state=FAILED_TERMINAL"
	for pages := 0; next != ""; pages++ {
		require.Less(t, pages, 20)
		_, body := get(t, h, next)
		if pages == 0 {
			require.Contains(t, body, "scan limit")
		}
		for _, m := range jobLink.FindAllStringSubmatch(body, -1) {
			dead[m[1]] = true
		}
		next = nextLink(body)
	}
	require.Equal(t, map[string]bool{f.dead["acme"].String(): true, f.dead["globex"].String(): true}, dead)

	// One tenant's listing walks that tenant's keys only.
	_, body := get(t, h, "/jobs?tenant=acme&kind=webhook.deliver")
	require.Len(t, jobLink.FindAllStringSubmatch(body, -1), 1)
}

var (
	jobLink  = regexp.MustCompile(`href="/jobs/([0-9a-f-]{36})"`)
	nextHref = regexp.MustCompile(`<a href="(/(?:jobs|dead)\?[^"]*)">(?:Older|Continue)`)
)

func nextLink(body string) string {
	m := nextHref.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "&amp;", "&")
}

// A fragment request answers only that part of the page, for the
// refreshing script.
func TestFragment(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	code, body := get(t, h, "/?fragment=live")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Live work by queue")
	require.NotContains(t, body, "<html")
	code, body = get(t, h, "/jobs/"+f.dead["acme"].String()+"?fragment=detail")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Attempts")
	require.NotContains(t, body, "<header")
}

// New refuses a config it cannot serve, naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for field, cfg := range map[string]console.Config{
		"DB":             {},
		"Actor":          {DB: f.pool, EnableActions: true},
		"Schema":         {DB: f.pool, Schema: "bad schema"},
		"BasePath":       {DB: f.pool, BasePath: "console/"},
		"Tenant":         {DB: f.pool, Tenant: "a\x00b"},
		"CSRFKey":        {DB: f.pool, CSRFKey: []byte("short")},
		"TrustedOrigins": {DB: f.pool, TrustedOrigins: []string{"ops.example.com/path"}},
		"Queues":         {DB: f.pool, Queues: []string{"no spaces"}},
	} {
		_, err := console.New(cfg)
		require.ErrorIs(t, err, console.ErrInvalidConfig, field)
		require.Contains(t, err.Error(), field, field)
	}
	// A base path prefixes every link: only a clean absolute path will do.
	for _, base := range []string{"//evil.example", "///x", "/ops//console", "/ops/../x", "/ops/./x", "/", "/ops/", "ops",
		"/ops console", "/ops?x", "/ops#x", "/ops;x", "/%2e%2e", `/ops\x`} {
		_, err := console.New(console.Config{DB: f.pool, BasePath: base})
		require.ErrorIs(t, err, console.ErrInvalidConfig, base)
		require.Contains(t, err.Error(), "BasePath", base)
	}
	for _, base := range []string{"", "/console", "/ops/console", "/a.b/c_d-e~f"} {
		_, err := console.New(console.Config{DB: f.pool, BasePath: base})
		require.NoError(t, err, base)
	}
}

// Mounted under a base path, links and cookies stay under it.
func TestBasePath(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{BasePath: "/ops/console", EnableActions: true, Actor: func(*http.Request) string { return "ops" }})
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", h)
	mux.Handle("/ops/console", h)
	code, body := get(t, mux, "/ops/console/jobs")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="/ops/console/jobs/`)
	require.Contains(t, body, `href="/ops/console/static/console.css"`)
	code, _ = get(t, mux, "/ops/console/static/console.js")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, mux, "/ops/console")
	require.Equal(t, http.StatusMovedPermanently, code)
}

// A pool edit that leaves a checkbox's field out keeps the flag; the form
// itself sends "off" before a ticked box's "on", so unticking turns it off.
func TestPoolEditKeepsFlags(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lim, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)
	require.NoError(t, lim.SetPool(t.Context(), admission.Pool{Name: "flags", RPM: 60, TPM: 10_000, MaxInFlight: 2,
		ChargeReserved: true, RefundUncertain: true}))
	s := &session{t: t, h: f.console(t, console.Config{EnableActions: true})}
	_, body := s.get("/pools")
	require.Contains(t, body, `name="charge_reserved" value="off"`, "the form says when a box is unticked")
	token := csrfFrom(t, body)
	user := http.Header{"X-Test-User": {"ops"}}
	flags := func() (charge, refund bool) {
		t.Helper()
		require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT charge_reserved, refund_uncertain FROM "+f.schema+".admission_pools WHERE name = 'flags'").Scan(&charge, &refund))
		return charge, refund
	}
	rec := s.post("/pools/flags", url.Values{"csrf_token": {token}, "rpm": {"120"}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	charge, refund := flags()
	require.True(t, charge, "an rpm-only edit keeps charge_reserved")
	require.True(t, refund, "an rpm-only edit keeps refund_uncertain")

	rec = s.post("/pools/flags", url.Values{"csrf_token": {token}, "charge_reserved": {"off", "on"}, "refund_uncertain": {"off"}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	charge, refund = flags()
	require.True(t, charge, "a ticked box stays on")
	require.False(t, refund, "an unticked box turns off")

	rec = s.post("/pools/flags", url.Values{"csrf_token": {token}, "refund_uncertain": {"yes"}}, user)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "refund_uncertain: ")
}

// Behind a reverse proxy that rewrites Host, a browser's same-origin
// action passes (Sec-Fetch-Site is the browser's own label); one from a
// browser without that header passes when its Origin is trusted. The
// cookie is Secure when the host says browsers use HTTPS.
func TestCSRFBehindProxy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{EnableActions: true, TrustedOrigins: []string{"https://ops.example.com"}, SecureCookie: true})
	s := &session{t: t, h: h}
	_, body := s.get("/jobs/" + f.dead["acme"].String())
	require.NotEmpty(t, s.cookie)
	require.True(t, s.cookie[0].Secure, "SecureCookie marks the CSRF cookie Secure")
	token := csrfFrom(t, body)
	proxied := func(extra ...string) http.Header {
		h := http.Header{"X-Test-User": {"ops"}, "Host": {"10.0.0.7:8080"}}
		for i := 0; i+1 < len(extra); i += 2 {
			h.Set(extra[i], extra[i+1])
		}
		return h
	}
	target := "/jobs/" + f.dead["acme"].String() + "/replay"
	form := url.Values{"csrf_token": {token}, "reason": {"behind a proxy"}}
	replayed(t, s.post(target, form, proxied("Sec-Fetch-Site", "same-origin", "Origin", "https://console.example.com")))
	replayed(t, s.post(target, form, proxied("Origin", "https://ops.example.com")))
	for _, site := range []string{"cross-site", "same-site"} {
		rec := s.post(target, form, proxied("Sec-Fetch-Site", site, "Origin", "https://evil.example.com"))
		require.Equal(t, http.StatusForbidden, rec.Code, site)
		require.Contains(t, rec.Body.String(), "csrf: ", site)
	}
	rec := s.post(target, form, proxied("Origin", "https://evil.example.com"))
	require.Equal(t, http.StatusForbidden, rec.Code, "an untrusted Origin that is not the Host")

	// Without the flag, a plain-HTTP request gets a cookie without Secure.
	plain := &session{t: t, h: f.console(t, console.Config{EnableActions: true})}
	plain.get("/jobs/" + f.dead["acme"].String())
	require.NotEmpty(t, plain.cookie)
	require.False(t, plain.cookie[0].Secure)
}

// The live counts are exact under the cap: per queue on the overview, per
// (queue, tenant) on the tenants page, across tenants and priorities,
// runnable apart from scheduled (a retry's delay, a job for later). A
// count at its cap, or a walk over the live work stopped at it, is shown
// as a lower bound.
func TestLiveCounts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract", Queue: "extraction",
		Priority: 5, Payload: []byte(`{}`)})
	require.NoError(t, err)
	_, body := get(t, f.console(t, console.Config{}), "/?fragment=live")
	// extraction: 12 accepted, 9 claimed, plus one at another priority;
	// two retries wait a minute; one job runs. default: one job an hour
	// away per tenant.
	require.Regexp(t, `<td>extraction</td><td class="n">4</td><td class="n">2</td><td class="n">1</td>`, body)
	require.Regexp(t, `<td>default</td><td class="n">0</td><td class="n">2</td><td class="n">0</td>`, body)

	_, body = get(t, f.console(t, console.Config{Tenant: "acme"}), "/?fragment=live")
	require.Regexp(t, `<td>default</td><td class="n">0</td><td class="n">1</td><td class="n">0</td>`, body)

	_, body = get(t, f.console(t, console.Config{}), "/tenants?fragment=rows")
	cells := regexp.MustCompile(`(?s)<td class="clip" title="extraction">extraction</td><td class="clip" title="acme"><a [^>]*>acme</a></td>\s*<td>.*?</td>\s*<td class="n">(\d+)</td><td class="n">(\d+)</td>`).FindStringSubmatch(body)
	require.NotNil(t, cells, body)
	acmeRunnable := cells[1]
	require.Equal(t, "1", cells[2], "acme's retry waits")
	// acme's runnable: 6 accepted, those of the 9 claims that were its,
	// and the one at priority 5.
	require.NotEqual(t, "0", acmeRunnable)

	_, body = get(t, f.console(t, console.Config{CountCap: 1}), "/?fragment=live")
	require.Regexp(t, `<td>extraction</td><td class="n">\d+&#43;</td><td class="n">\d+&#43;</td><td class="n">\d+&#43;</td>`, body,
		"a walk stopped at the cap makes every count a lower bound")
}

// The overview's chart counts each minute's finished jobs per state up to
// a cap; a count that reached it is a lower bound, and the bar's title,
// the totals and the peak say so.
func TestChartCapShown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	_, body := get(t, h, "/?fragment=live")
	require.Contains(t, body, "2 succeeded")
	require.NotContains(t, body, "stops at")
	console.SetChartCapForTest(h, 1)
	_, body = get(t, h, "/?fragment=live")
	plus := regexp.QuoteMeta("1&#43;")
	require.Regexp(t, `<title>\d\d:\d\d: `+plus+` succeeded</title>`, body)
	require.Regexp(t, `succeeded `+plus+` `, body)
	require.Contains(t, body, "peak ≥ ")
	require.Contains(t, body, "Each minute's count per state stops at 1")
}

// A job's page shows its latest events even when the outbox holds more
// events during its life than the scan reads from the bottom: the range is
// read from both ends, and the page says that its middle was not. The
// dead letter's requested event is a single-event row (a one-job enqueue),
// found in the event-id range; its dead-lettered event is in the batch row
// of the completions that finished it, found among the batch rows written
// in its life, here the latest of them.
func TestJobEventsReadFromBothEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dead := f.dead["acme"]
	var first uuid.UUID
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT event_id FROM "+f.schema+".outbox WHERE aggregate_id = $1 AND event_type = 'invoice.extract.requested'", dead).Scan(&first))
	var deadRow time.Time
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT created_at FROM "+f.schema+".outbox_batches WHERE events::jsonb @> jsonb_build_array(jsonb_build_object('aggregate', $1::text, 'type', 'invoice.extract.dead_lettered'))", dead).Scan(&deadRow))
	// 300 other events after the job's first.
	_, err := f.pool.Exec(t.Context(), `INSERT INTO `+f.schema+`.outbox (event_id, aggregate_id, topic, key, event_type, payload, created_at)
		SELECT (lpad(to_hex(('x' || substr(replace($1::text, '-', ''), 1, 16))::bit(64)::bigint), 16, '0')
				|| lpad(to_hex(('x' || substr(replace($1::text, '-', ''), 17, 16))::bit(64)::bigint + i), 16, '0'))::uuid,
			gen_random_uuid(), 'llmq.jobs', 'k', 'other.requested', '{}', now()
		FROM generate_series(1, 300) AS i`, first)
	require.NoError(t, err)
	// 10 other batch rows written just before the dead letter's.
	_, err = f.pool.Exec(t.Context(), `INSERT INTO `+f.schema+`.outbox_batches (first_seq, last_seq, created_at, event_count, events)
		SELECT s, s, $1::timestamptz - interval '1 second', 1, jsonb_build_array(jsonb_build_object('seq', s, 'id', gen_random_uuid(),
			'aggregate', gen_random_uuid(), 'topic', 'llmq.jobs', 'type', 'other.completed', 'payload', '{}'::jsonb))
		FROM (SELECT nextval(pg_get_serial_sequence('`+f.schema+`.outbox', 'seq')) AS s FROM generate_series(1, 10)) AS q`, deadRow)
	require.NoError(t, err)

	h := f.console(t, console.Config{})
	console.SetEventScanLimitForTest(h, 100) // and 2 batch rows from each end
	_, body := get(t, h, "/jobs/"+dead.String())
	require.Contains(t, body, "invoice.extract.dead_lettered", "the latest batch row is read from the top")
	require.Contains(t, body, "invoice.extract.requested", "the first event is found from the bottom")
	require.Contains(t, body, "Scan limit reached")

	console.SetEventScanLimitForTest(h, 100_000)
	_, body = get(t, h, "/jobs/"+dead.String())
	require.Contains(t, body, "invoice.extract.dead_lettered")
	require.NotContains(t, body, "Scan limit reached", "a range read whole is not cut")
}

// walk follows a listing's "Older"/"Continue" links from start and returns
// the job ids in the order the pages showed them, and whether any page
// ended at the scan limit.
func walk(t *testing.T, h http.Handler, start string) (ids []string, windowed bool) {
	t.Helper()
	for next, pages := start, 0; next != ""; pages++ {
		require.Less(t, pages, 50, next)
		code, body := get(t, h, next)
		require.Equal(t, http.StatusOK, code, next)
		windowed = windowed || strings.Contains(body, "scan limit")
		for _, m := range jobLink.FindAllStringSubmatch(body, -1) {
			ids = append(ids, m[1])
		}
		next = nextLink(body)
	}
	return ids, windowed
}

// Dead letters page by (finished_at, id), most recent first: a batch
// finished at one instant is split across pages and scan windows without
// losing or repeating a job.
func TestDeadLetterCursorTies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	var batch []uuid.UUID
	for i := range 7 {
		j, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: "initech", Kind: "invoice.extract", Queue: "default",
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		require.NoError(t, err)
		batch = append(batch, j.Job.ID)
	}
	var claimed []*jobs.Job
	for tries := 0; len(claimed) < 7; tries++ {
		require.Less(t, tries, 20, "the batch could not be claimed")
		more, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"invoice.extract"}, Worker: "w", Limit: 7 - len(claimed), LeaseDuration: time.Minute})
		require.NoError(t, err)
		claimed = append(claimed, more...)
	}
	var done []jobs.Completion
	for _, j := range claimed {
		c := completion(j, jobs.OutcomeFailed, "permanent", jobs.Usage{})
		c.Error = "batch failure"
		done = append(done, c)
	}
	_, err := f.store.Complete(ctx, f.pool, done)
	require.NoError(t, err)
	// One instant for the whole batch, whatever the clock did.
	_, err = f.pool.Exec(ctx, "UPDATE "+f.schema+".jobs SET finished_at = date_trunc('second', now()) WHERE id = ANY($1)", dbsql.UUIDs(batch))
	require.NoError(t, err)

	rows, err := f.pool.Query(ctx, "SELECT id::text FROM "+f.schema+".jobs WHERE state = 'FAILED_TERMINAL' ORDER BY finished_at DESC, id DESC")
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, want, 9, "the batch and the fixture's two")
	rows, err = f.pool.Query(ctx, "SELECT id::text FROM "+f.schema+".jobs WHERE state = 'FAILED_TERMINAL' AND queue = 'default' ORDER BY finished_at DESC, id DESC")
	require.NoError(t, err)
	wantBatch, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, wantBatch, 7)

	for _, scan := range []int{2, 3, 20} {
		h := f.console(t, console.Config{ScanLimit: scan})
		got, _ := walk(t, h, "/dead?limit=2")
		require.Equal(t, want, got, "scan limit %d: every dead letter once, by finish time then id", scan)
		// A filter that leaves pages short continues from each window's
		// last (finished_at, id), inside the batch's tie.
		got, windowed := walk(t, h, "/dead?queue=default&limit=3")
		require.Equal(t, wantBatch, got, "scan limit %d: the batch once, in order", scan)
		require.Equal(t, scan < 7, windowed, "scan limit %d: pages stop at the window", scan)
	}
}

// One tenant's listings walk that tenant's keys (ListTenantJobs and
// ListTenantScanEnd): every job of the tenant once, newest first, none of
// another's, across pages and scan windows.
func TestTenantPagination(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rows, err := f.pool.Query(t.Context(), "SELECT id::text FROM "+f.schema+".job_keys WHERE tenant = 'acme' ORDER BY id DESC")
	require.NoError(t, err)
	want, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, want, 7)
	for _, cfg := range []console.Config{{ScanLimit: 3}, {ScanLimit: 3, Tenant: "acme"}} {
		h := f.console(t, cfg)
		got, _ := walk(t, h, "/jobs?tenant=acme&limit=2")
		require.Equal(t, want, got, "tenant %q", cfg.Tenant)

		got, windowed := walk(t, h, "/jobs?tenant=acme&state=FAILED_TERMINAL")
		require.Equal(t, []string{f.dead["acme"].String()}, got)
		require.True(t, windowed, "a rare state stops at the window and continues")

		got, _ = walk(t, h, "/dead?tenant=acme&state=REVIEW_REQUIRED")
		require.Equal(t, []string{f.review["acme"].String()}, got)
	}
}
