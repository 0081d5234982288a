package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/jobs"
)

// The tests of the operator review's findings: escaping, layout, triage.

// finishJob enqueues a job for tenant in the extraction queue and completes its attempts
// with the outcomes given, in order (each claim takes the job again), and
// returns it as stored.
func (f *fixture) finishJob(t *testing.T, store *jobs.PostgresStore, tenant, kind, errText string, outcomes ...jobs.CompletionOutcome) *jobs.Job {
	t.Helper()
	const queue = "extraction"
	ctx := t.Context()
	res, err := store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: kind, Queue: queue,
		Payload: []byte(`{"n":1}`), MaxAttempts: len(outcomes) + 1})
	require.NoError(t, err)
	for _, o := range outcomes {
		var claimed []*jobs.Job
		require.Eventually(t, func() bool {
			claimed, err = store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: queue, Kinds: []string{kind}, Worker: "worker-z",
				Limit: 1, LeaseDuration: time.Minute})
			require.NoError(t, err)
			return len(claimed) == 1
		}, 10*time.Second, 20*time.Millisecond)
		require.Equal(t, res.Job.ID, claimed[0].ID)
		c := completion(claimed[0], o, "transient", jobs.Usage{InputTokens: 10, OutputTokens: 1})
		c.Worker = "worker-z"
		if c.Error != "" {
			c.Error = errText
		}
		c.RetryDelay = 0
		out, err := store.Complete(ctx, f.pool, []jobs.Completion{c})
		require.NoError(t, err)
		require.NoError(t, out[0].Err)
	}
	j, err := store.Lookup(ctx, f.pool, res.Job.ID)
	require.NoError(t, err)
	return j
}

// /static/ serves the embedded static files by their exact names: no
// listing, no template through an escaped "..", under a base path too.
func TestStaticExactNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, base := range []string{"", "/ops"} {
		h := f.console(t, console.Config{BasePath: base})
		for _, name := range []string{"console.css", "console.js"} {
			code, body := get(t, h, base+"/static/"+name)
			require.Equal(t, http.StatusOK, code, name)
			require.NotEmpty(t, body)
		}
		for _, p := range []string{"/static/", "/static/%2e%2e/templates/layout.html", "/static/..%2ftemplates/layout.html",
			"/static/%2E%2E%2Ftemplates%2Flayout.html", "/static/templates/layout.html", "/static/nope.css", "/static/console.css/",
			"/static/console%2ecss", "/static/./console.css", "/static"} {
			code, body := get(t, h, base+p)
			require.NotEqual(t, http.StatusOK, code, base+p)
			require.NotContains(t, body, "{{define", base+p)
			require.NotContains(t, body, `<a href="console.css">`, base+p)
			require.NotContains(t, body, "llmq console: one small stylesheet", base+p)
		}
		code, _ := get(t, h, base+"/static/")
		require.Equal(t, http.StatusNotFound, code)
		code, _ = get(t, h, base+"/static/%2e%2e/templates/layout.html")
		require.NotEqual(t, http.StatusOK, code)
	}
}

// A pool's name goes into its form's action escaped, so a name shaped as
// a path cannot point the form (and its valid token) at another action;
// the post reaches the pool it names. A name that cannot be a path
// segment gets no form and is refused.
func TestPoolNameEscapedInPath(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lim, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)
	dead := f.dead["acme"]
	evil := "x/../../jobs/" + dead.String() + "/replay"
	for _, name := range []string{evil, "..", "a?b#c%2F"} {
		require.NoError(t, lim.SetPool(t.Context(), admission.Pool{Name: name, RPM: 60, TPM: 1000, MaxInFlight: 1}))
	}
	for _, base := range []string{"", "/ops"} {
		h := f.console(t, console.Config{EnableActions: true, BasePath: base})
		s := &session{t: t, h: h}
		code, body := s.get(base + "/pools")
		require.Equal(t, http.StatusOK, code)
		escaped := base + "/pools/" + url.PathEscape(evil)
		require.Contains(t, body, `action="`+escaped+`"`)
		require.NotContains(t, body, `action="`+base+`/pools/x/`)
		require.Contains(t, body, `action="`+base+`/pools/a%3Fb%23c%252F"`)
		require.NotContains(t, body, `action="`+base+`/pools/.."`)
		require.Contains(t, body, "cannot be changed here")

		rec := s.post(escaped, url.Values{"csrf_token": {csrfFrom(t, body)}, "rpm": {"120"}},
			http.Header{"X-Test-User": {"ops@example.com"}})
		require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
		require.Equal(t, base+"/pools?flash=pool-updated", rec.Header().Get("Location"))
		f.requireNoReplay(t, dead)
		pools, err := lim.Pools(t.Context())
		require.NoError(t, err)
		for _, p := range pools {
			if p.Name == evil {
				require.Equal(t, 120, p.RPM)
			}
		}
		rec = s.post(base+"/pools/%2E%2E", url.Values{"csrf_token": {csrfFrom(t, body)}, "rpm": {"7"}},
			http.Header{"X-Test-User": {"ops@example.com"}})
		require.NotEqual(t, http.StatusSeeOther, rec.Code)
	}
	for _, p := range must(lim.Pools(t.Context())) {
		require.NotEqual(t, 7, p.RPM, p.Name)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A SUCCEEDED job shows no error (its attempts still show theirs), its
// row in a listing none either, and no finished job shows a lease.
func TestSucceededShowsNoStaleError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	j := f.finishJob(t, f.store, "acme", "stale.error", "an earlier attempt's error",
		jobs.OutcomeRetry, jobs.OutcomeSucceeded)
	require.Equal(t, jobs.StateSucceeded, j.State)
	require.NotEmpty(t, j.LastError, "the store keeps the earlier attempt's error on the job")
	h := f.console(t, console.Config{})
	code, body := get(t, h, "/jobs/"+j.ID.String())
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `id="job-error"`)
	require.NotContains(t, body, "<h2>Error</h2>")
	require.Equal(t, 1, strings.Count(body, "<bdi>an earlier attempt&#39;s error</bdi>"), "the attempts table still shows it")
	require.NotContains(t, body, "<dt>Lease</dt>")

	_, list := get(t, h, "/jobs?state=SUCCEEDED")
	require.Contains(t, list, j.ID.String())
	require.NotContains(t, list, "an earlier attempt")

	// A dead job shows its error and no lease.
	_, body = get(t, h, "/jobs/"+f.dead["acme"].String())
	require.Contains(t, body, `id="job-error"`)
	require.NotContains(t, body, "<dt>Lease</dt>")
	// A running job shows its lease.
	_, body = get(t, h, "/jobs/"+f.running.String())
	require.Contains(t, body, "<dt>Lease</dt>")
}

// The dead-letter page marks jobs already replayed, counts each tab, and
// its tabs keep the filters; a job's replay form comes before a long
// error.
func TestDeadLetterTriage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.store.Replay(t.Context(), f.pool, jobs.ReplayParams{Tenant: "acme", JobID: f.dead["acme"], By: "ops", Reason: "retry"})
	require.NoError(t, err)
	h := f.console(t, console.Config{EnableActions: true, Actor: func(*http.Request) string { return "ops" }})
	code, body := get(t, h, "/dead?queue=extraction&kind=invoice.extract")
	require.Equal(t, http.StatusOK, code)
	row := regexp.MustCompile(`(?s)<tr>\s*<td><a class="mono" href="/jobs/` + f.dead["acme"].String() + `".*?</tr>`).FindString(body)
	require.Contains(t, row, ">replayed</span>", "the replayed dead letter is marked")
	row = regexp.MustCompile(`(?s)<tr>\s*<td><a class="mono" href="/jobs/` + f.dead["globex"].String() + `".*?</tr>`).FindString(body)
	require.NotEmpty(t, row)
	require.NotContains(t, row, ">replayed</span>")

	tabs := regexp.MustCompile(`(?s)<p class="tabs" id="dead-tabs">.*?</p>`).FindString(body)
	require.Regexp(t, `href="/dead\?kind=invoice\.extract&amp;queue=extraction&amp;state=FAILED_TERMINAL"[^>]*>Dead letters \(FAILED_TERMINAL\) <span class="count">2</span>`, tabs)
	require.Regexp(t, `href="/dead\?kind=invoice\.extract&amp;queue=extraction&amp;state=REVIEW_REQUIRED"[^>]*>Awaiting review \(REVIEW_REQUIRED\) <span class="count">2</span>`, tabs)

	long := f.finishJob(t, f.store, "globex", "long.error", strings.Repeat("provider said no. ", 600),
		jobs.OutcomeFailed)
	require.Equal(t, jobs.StateFailedTerminal, long.State)
	_, body = get(t, h, "/jobs/"+long.ID.String())
	form, errAt := strings.Index(body, `id="replay-form"`), strings.Index(body, `id="job-error"`)
	require.Positive(t, form)
	require.Positive(t, errAt)
	require.Less(t, form, errAt, "the replay form comes before the error")
	require.Contains(t, body, `<details class="error">`, "a long error is collapsed")

	_, body = get(t, h, "/jobs/"+f.dead["acme"].String())
	require.Contains(t, body, `id="replayed-before"`)
}

var tenantRow = regexp.MustCompile(`(?s)<tr data-status="(\w+)">\s*<td class="clip" title="([^"]*)">.*?<td class="clip" title="([^"]*)">.*?</tr>`)

// The tenants page hides idle rows unless asked, sorts by backlog, tags
// each row by its counts, shows each tenant's last hour once, and filters
// by a case-insensitive substring with LIKE's wildcards taken literally.
func TestTenantsPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// initech's only job is done: its row is idle.
	f.finishJob(t, f.store, "initech", "idle.job", "", jobs.OutcomeSucceeded)
	// umbrella has the largest backlog.
	for range 5 {
		_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "Umbrella", Kind: "invoice.extract", Queue: "default",
			Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	h := f.console(t, console.Config{})
	code, body := get(t, h, "/tenants")
	require.Equal(t, http.StatusOK, code)
	rows := tenantRow.FindAllStringSubmatch(body, -1)
	require.NotEmpty(t, rows)
	for _, r := range rows {
		require.NotEqual(t, "initech", r[3], "idle rows are hidden by default")
		require.NotEqual(t, "idle", r[1])
	}
	require.Equal(t, "Umbrella", rows[0][3], "the largest backlog first")
	require.Equal(t, "backlog", rows[0][1])
	require.Contains(t, body, "1 idle row (no waiting or running job) hidden")
	hour := regexp.MustCompile(`(?s)<table class="list names" id="tenant-hour">.*?</table>`).FindString(body)
	for _, tenant := range []string{"acme", "globex", "Umbrella"} {
		require.Equal(t, 1, strings.Count(hour, `title="`+tenant+`"`), "each tenant's last hour once: %s", tenant)
	}
	require.NotContains(t, regexp.MustCompile(`(?s)<table class="list names" id="tenant-rows">.*?</table>`).FindString(body), "Accepted")

	_, body = get(t, h, "/tenants?idle=0&idle=1")
	var idle bool
	for _, r := range tenantRow.FindAllStringSubmatch(body, -1) {
		if r[3] == "initech" {
			idle = true
			require.Equal(t, "idle", r[1])
		}
	}
	require.True(t, idle, "shown on request")

	_, body = get(t, h, "/tenants?tenant=MBREL")
	rows = tenantRow.FindAllStringSubmatch(body, -1)
	require.Len(t, rows, 1)
	require.Equal(t, "Umbrella", rows[0][3])
	for _, pattern := range []string{"_", "%", "a_m", `\`} {
		code, body = get(t, h, "/tenants?idle=1&tenant="+url.QueryEscape(pattern))
		require.Equal(t, http.StatusOK, code)
		require.Empty(t, tenantRow.FindAllStringSubmatch(body, -1), "%q matches literally", pattern)
	}
	code, _ = get(t, h, "/tenants?idle=2")
	require.Equal(t, http.StatusBadRequest, code)
}

// Times are labelled and read as UTC, numbers are written one way, cost
// says its unit, the usage chart's bars name their tenant, and the
// attempt timeline labels each attempt with its duration on a bar that
// stays visible.
func TestSmallerFindings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	for _, p := range []string{"/jobs", "/dead"} {
		_, body := get(t, h, p)
		require.Contains(t, body, `from (UTC) <input type="datetime-local" name="from"`, p)
		require.Contains(t, body, `to (UTC) <input type="datetime-local" name="to"`, p)
	}
	_, body := get(t, h, "/pools")
	require.Contains(t, body, "Cost (price currency)")
	require.Regexp(t, `<title>\d{4}-\d\d-\d\d \(UTC\), acme: [\d,]+\.\d\d \(price currency\)</title>`, body)
	for _, cell := range regexp.MustCompile(`<td class="n">([^<]*)</td>`).FindAllStringSubmatch(body, -1) {
		require.NotRegexp(t, `\d{4}`, cell[1], "numbers carry thousands separators: %q", cell[1])
	}
	j := f.finishJob(t, f.store, "acme", "quick.job", "quick", jobs.OutcomeRetry, jobs.OutcomeRetry, jobs.OutcomeSucceeded)
	_, body = get(t, h, "/jobs/"+j.ID.String())
	labels := regexp.MustCompile(`<text class="tlabel[^"]*"[^>]*>([^<]*)</text>`).FindAllStringSubmatch(body, -1)
	require.Len(t, labels, 3)
	for i, l := range labels {
		require.Regexp(t, fmt.Sprintf(`^#%d \w+ · ([\d.]+(µs|ms|s)|-)$`, i+1), l[1])
	}
	for _, w := range regexp.MustCompile(`<rect x="[^"]*" y="[^"]*" width="([^"]*)" height="14"`).FindAllStringSubmatch(body, -1) {
		var width float64
		_, err := fmt.Sscanf(w[1], "%g", &width)
		require.NoError(t, err)
		require.GreaterOrEqual(t, width, 8.0)
	}
}

// Bidirectional controls in a payload show as escapes, and the values of
// tenants' names sit in isolating elements.
func TestBidiIsolation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "evil\u202eemca", Kind: "invoice.extract", Queue: "extraction",
		Payload: []byte(`{"note":"total \u202e 0001"}`)})
	require.NoError(t, err)
	h := f.console(t, console.Config{})
	_, body := get(t, h, "/jobs/"+res.Job.ID.String())
	pre := regexp.MustCompile(`(?s)<h2>Payload</h2><pre>(.*?)</pre>`).FindStringSubmatch(body)
	require.NotNil(t, pre)
	require.NotContains(t, pre[1], "\u202e")
	require.Contains(t, pre[1], `\u202e`)
	require.Contains(t, body, "<bdi>evil\u202eemca</bdi>")
	_ = uuid.Nil
}

// Long names and errors keep every page within the window's width and the
// listings at a sane height, in a real browser: 35 dead letters of a
// tenant, kind and queue with 100-character names and 10 KB errors. The
// cells holding data isolate their text (a right-to-left override in a
// tenant's name), a pool's form posts where its name says, and the replay
// form of a job with a long error is in the first screen.
func TestBrowserLongValues(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	longQueue := "q" + strings.Repeat("ueue-", 19) + "long"
	longKind := "k" + strings.Repeat("ind.x", 19) + "long"
	longTenant := "tenant\u202e" + strings.Repeat("T", 93)
	require.Len(t, longQueue, 100)
	require.Len(t, longKind, 100)
	store, err := jobs.NewStore(jobs.Config{Schema: f.schema, Queues: []string{longQueue}, DisableNotify: true})
	require.NoError(t, err)
	const n = 35
	for range n {
		_, err := store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: longTenant, Kind: longKind, Queue: longQueue,
			Payload: []byte(`{"a":"` + strings.Repeat("p", 2000) + `"}`), MaxAttempts: 1})
		require.NoError(t, err)
	}
	claimed, err := store.Claim(t.Context(), f.pool, jobs.ClaimParams{Queue: longQueue, Kinds: []string{longKind}, Worker: "w",
		Limit: n, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, n)
	var done []jobs.Completion
	for _, j := range claimed {
		c := completion(j, jobs.OutcomeFailed, "permanent", jobs.Usage{})
		c.Error = strings.Repeat("E", 2000) + " " + strings.Repeat("error text ", 750)
		done = append(done, c)
	}
	out, err := store.Complete(t.Context(), f.pool, done)
	require.NoError(t, err)
	for _, r := range out {
		require.NoError(t, r.Err)
	}
	lim, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)
	evil := "x/../../jobs/" + f.dead["acme"].String() + "/replay"
	require.NoError(t, lim.SetPool(t.Context(), admission.Pool{Name: evil, RPM: 60, TPM: 1000, MaxInFlight: 1}))

	srv := httptestServer(t, f.console(t, console.Config{EnableActions: true, RefreshInterval: -1,
		Actor: func(*http.Request) string { return "browser-test" }}))
	b := newBrowser(t)
	for _, p := range []struct {
		path      string
		maxHeight int
	}{
		{"/jobs", 3500},
		{"/jobs?queue=" + longQueue, 3000},
		{"/dead", 3000},
		{"/dead?state=REVIEW_REQUIRED", 3000},
		{"/tenants", 3000},
		{"/tenants?idle=1", 3000},
		{"/jobs/" + claimed[0].ID.String(), 0},
		{"/pools", 0},
		{"/", 0},
	} {
		b.do(chromedp.Navigate(srv.URL+p.path), chromedp.WaitVisible(chromedp.CSS("main")))
		width := run(b, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
		require.LessOrEqual(t, width[0], width[1], "%s is wider than the window", p.path)
		if p.maxHeight > 0 {
			h := run(b, chromedp.Evaluate[int](`document.documentElement.scrollHeight`))
			require.LessOrEqual(t, h, p.maxHeight, "%s is too tall", p.path)
		}
		// Every table cell isolates its text.
		mixed := run(b, chromedp.Evaluate[int](`[...document.querySelectorAll("td")].filter(td => getComputedStyle(td).unicodeBidi !== "isolate").length`))
		require.Zero(t, mixed, "%s has cells that do not isolate their text", p.path)
		b.screenshot("long-" + strings.NewReplacer("/", "_", "?", "_", "=", "_").Replace(p.path[:min(len(p.path), 40)]))
	}
	// The Error column of the dead letters keeps its room.
	b.do(chromedp.Navigate(srv.URL+"/dead"), chromedp.WaitVisible(chromedp.CSS("main")))
	errWidth := run(b, chromedp.Evaluate[int](`Math.round(document.querySelector("table.jobrows tbody td.err").getBoundingClientRect().width)`))
	require.GreaterOrEqual(t, errWidth, 250)
	title := run(b, chromedp.Evaluate[string](`document.querySelector("table.jobrows tbody td.clip").title`))
	require.Len(t, title, len(longTenant), "the full value is in the title")

	// The replay form of a job with a 10 KB error is on the first screen.
	b.do(chromedp.Navigate(srv.URL+"/jobs/"+claimed[0].ID.String()), chromedp.WaitVisible(chromedp.CSS("#replay-form")))
	top := run(b, chromedp.Evaluate[[]int](`[Math.round(document.querySelector("#replay-form").getBoundingClientRect().bottom), window.innerHeight]`))
	require.Less(t, top[0], top[1])

	// The pool's form posts to the pool.
	b.do(chromedp.Navigate(srv.URL+"/pools"), chromedp.WaitVisible(chromedp.CSS("main")))
	actions := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("form.pool-form")].map(f => f.action)`))
	require.Contains(t, actions, srv.URL+"/pools/"+url.PathEscape(evil))
	for _, a := range actions {
		require.True(t, strings.HasPrefix(a, srv.URL+"/pools/"), a)
	}
	b.requireNoConsoleErrors("long values")
}

func httptestServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
