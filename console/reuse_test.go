package console_test

import (
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/jobs"
)

// reuseJob accepts a job of kind doc.summarize for tenant with reuse,
// claims it and completes it as a runner would: with the result its claim
// found to reuse, naming the source, or with a computed one. It returns
// the finished job.
func (f *fixture) reuseJob(t *testing.T, tenant string, reuse jobs.Reuse) *jobs.Job {
	t.Helper()
	ctx := t.Context()
	res, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "doc.summarize", Queue: "default",
		Payload: []byte(`{"document":"d-1"}`), Reuse: &reuse})
	require.NoError(t, err)
	// A claim shares its limit among the tenants with waiting work in the
	// queue, whatever its kinds, so one may come back empty.
	var claimed []*jobs.Job
	for tries := 0; len(claimed) == 0; tries++ {
		require.Less(t, tries, 20, "the job could not be claimed")
		claimed, err = f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"doc.summarize"},
			Worker: "worker-r", Limit: 10, LeaseDuration: time.Minute})
		require.NoError(t, err)
	}
	require.Len(t, claimed, 1)
	j := claimed[0]
	require.Equal(t, res.Job.ID, j.ID)
	c := jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "worker-r",
		Outcome: jobs.OutcomeSucceeded, Result: j.Result, ReusedFrom: j.ReusedFrom}
	if j.ReusedFrom == uuid.Nil {
		c.Result = []byte(`{"summary":"three lines"}`)
		c.Usage = jobs.Usage{InputTokens: 900, OutputTokens: 80}
	}
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
	return out[0].Apply(j, c)
}

// reuseJobs are the jobs of seedReuse: acme computes under a tenant key
// and then reuses its own result; globex computes under a shared key and
// acme reuses globex's result.
type reuseJobs struct {
	computed, reused           *jobs.Job // acme's, tenant key
	sharedSource, sharedReused *jobs.Job // globex's, then acme's
	tenantKey, sharedKey       jobs.Reuse
}

func (f *fixture) seedReuse(t *testing.T) reuseJobs {
	t.Helper()
	r := reuseJobs{tenantKey: jobs.Reuse{Key: "sha256:acme-doc"}, sharedKey: jobs.Reuse{Key: "sha256:public-doc", Shared: true, TTL: 72 * time.Hour}}
	r.computed = f.reuseJob(t, "acme", r.tenantKey)
	r.reused = f.reuseJob(t, "acme", r.tenantKey)
	require.Equal(t, r.computed.ID, r.reused.ReusedFrom)
	r.sharedSource = f.reuseJob(t, "globex", r.sharedKey)
	r.sharedReused = f.reuseJob(t, "acme", r.sharedKey)
	require.Equal(t, r.sharedSource.ID, r.sharedReused.ReusedFrom)
	return r
}

var (
	reusedFromLine = regexp.MustCompile(`(?s)<dd id="reused-from">.*?</dd>`)
	reusedAttempt  = regexp.MustCompile(`(?s)<span class="outcome o-ok">reused</span>.*?</td>`)
)

// A job's page shows its reuse key, scope and TTL, and for a job that took
// another's result, "reused the result of" that job, linked, in its
// details and in its attempt timeline, where the attempt reads as reused.
// An operator's console links a shared key's source of another tenant,
// naming that tenant; a source retention pruned is shown by id alone.
func TestJobPageShowsReuse(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.seedReuse(t)
	h := f.console(t, console.Config{})

	code, body := get(t, h, "/jobs/"+r.computed.ID.String())
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<dt>Reuse key</dt><dd id="reuse-key"><span class="mono">sha256:acme-doc</span> <span class="muted">tenant acme's own · results up to 24h0m0s old`)
	require.Contains(t, body, `href="/reuse?kind=doc.summarize">invalidations</a>`)
	require.NotContains(t, body, "reused the result of", "a computed job took no one's result")
	require.Contains(t, body, `<span class="outcome o-ok">succeeded</span>`)

	_, body = get(t, h, "/jobs/"+r.reused.ID.String())
	line := reusedFromLine.FindString(body)
	require.Contains(t, line, `reused the result of <a class="mono" href="/jobs/`+r.computed.ID.String()+`"`)
	require.NotContains(t, line, "tenant", "the source is the job's own tenant's")
	attempt := reusedAttempt.FindString(body)
	require.NotEmpty(t, attempt, "the attempt reads as reused")
	require.Contains(t, attempt, `the result of</span> <a class="mono" href="/jobs/`+r.computed.ID.String()+`"`)
	require.Contains(t, body, `&#34;summary&#34;: &#34;three lines&#34;`, "the result it took")

	_, body = get(t, h, "/jobs/"+r.sharedReused.ID.String())
	require.Contains(t, body, `<span class="mono">sha256:public-doc</span> <span class="muted">shared: any tenant's job of the key takes its results · results up to 3d0h old`)
	line = reusedFromLine.FindString(body)
	require.Contains(t, line, `href="/jobs/`+r.sharedSource.ID.String()+`"`)
	require.Contains(t, line, "(tenant globex's)", "an operator sees whose result it was")
	require.Contains(t, reusedAttempt.FindString(body), `href="/jobs/`+r.sharedSource.ID.String()+`"`)

	// Retention prunes the source: its id stays, without a link to a page
	// that would say "no such job".
	_, err := f.pool.Exec(t.Context(), "DELETE FROM "+f.schema+".jobs WHERE id = $1", r.computed.ID)
	require.NoError(t, err)
	code, body = get(t, h, "/jobs/"+r.reused.ID.String())
	require.Equal(t, http.StatusOK, code, body)
	line = reusedFromLine.FindString(body)
	require.Contains(t, line, `title="`+r.computed.ID.String()+`"`)
	require.Contains(t, line, "no longer kept")
	require.NotContains(t, body, `href="/jobs/`+r.computed.ID.String()+`"`)
}

// On a tenant's console, a source of the tenant's own is linked; a shared
// key's source computed for another tenant is not: the console reads it
// through the tenant's keys as it reads any job, finds nothing, and shows
// the id the job itself records, unlinked, saying it may be another
// tenant's job or one no longer kept, with nothing of that tenant.
func TestJobPageReuseInATenantsConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.seedReuse(t)
	acme := f.console(t, console.Config{Tenant: "acme"})

	_, body := get(t, acme, "/jobs/"+r.reused.ID.String())
	require.Contains(t, reusedFromLine.FindString(body), `href="/jobs/`+r.computed.ID.String()+`"`, "its own source is linked")

	code, body := get(t, acme, "/jobs/"+r.sharedReused.ID.String())
	require.Equal(t, http.StatusOK, code, body)
	line := reusedFromLine.FindString(body)
	require.Contains(t, line, `title="`+r.sharedSource.ID.String()+`"`, "the id the job records")
	require.Contains(t, line, "not shown here: another tenant&#39;s job under the shared key, or one no longer kept")
	require.Contains(t, reusedAttempt.FindString(body), "another tenant&#39;s job")
	require.NotContains(t, body, `href="/jobs/`+r.sharedSource.ID.String()+`"`, "no link to another tenant's job")
	require.NotContains(t, body, "globex")
	code, _ = get(t, acme, "/jobs/"+r.sharedSource.ID.String())
	require.Equal(t, http.StatusNotFound, code, "which stays not found")

	// The tenant whose job computed the shared result sees it as any job.
	code, body = get(t, f.console(t, console.Config{Tenant: "globex"}), "/jobs/"+r.sharedSource.ID.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "sha256:public-doc")
	require.NotContains(t, body, "reused the result of")
}

// invalidate records an invalidation directly through the store, moved
// back by age so that the listing's order is certain.
func (f *fixture) invalidate(t *testing.T, p jobs.InvalidateReuseParams, age time.Duration) jobs.ReuseInvalidation {
	t.Helper()
	inv, _, err := f.store.InvalidateReuse(t.Context(), f.pool, p)
	require.NoError(t, err)
	_, err = f.pool.Exec(t.Context(), "UPDATE "+f.schema+".job_reuse_invalidations SET invalidated_at = invalidated_at - $1::interval WHERE id = $2",
		age.String(), inv.ID)
	require.NoError(t, err)
	return inv
}

var invalidationCell = regexp.MustCompile(`<tr>\s*<td class="n">(\d+)</td>`)

// invalidationIDs returns the invalidation ids of a reuse page, in its
// order.
func invalidationIDs(body string) []string {
	var ids []string
	for _, m := range invalidationCell.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

func idsOf(list ...jobs.ReuseInvalidation) []string {
	out := make([]string, len(list))
	for i, inv := range list {
		out[i] = itoa(inv.ID)
	}
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The reuse page lists the invalidations newest first with their kind,
// key, tenant, author and reason; filtered by kind, in pages that grow by
// a link. A tenant's console lists its tenant's and every tenant's, never
// another tenant's.
func TestReusePage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	oldest := f.invalidate(t, jobs.InvalidateReuseParams{Kind: "doc.summarize", Key: "sha256:acme-doc", Tenant: "acme", By: "ops@example.com", Reason: "acme's prompt v3 was wrong"}, 3*time.Hour)
	globex := f.invalidate(t, jobs.InvalidateReuseParams{Kind: "doc.summarize", Tenant: "globex", By: "ops@example.com", Reason: "globex asked"}, 2*time.Hour)
	every := f.invalidate(t, jobs.InvalidateReuseParams{Kind: "invoice.extract", By: "oncall", Reason: "the provider's bad day"}, time.Hour)
	newest := f.invalidate(t, jobs.InvalidateReuseParams{Kind: "doc.summarize", Key: "sha256:public-doc", By: "oncall", Reason: "a public document changed"}, 0)

	h := f.console(t, console.Config{})
	code, body := get(t, h, "/reuse")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `href="/reuse" class="on"`, "the navigation has the page")
	require.Equal(t, idsOf(newest, every, globex, oldest), invalidationIDs(body), "newest first")
	require.Contains(t, body, `<td class="t">invoice.extract</td>
<td><span class="muted">every key</span></td>
<td><span class="muted">every tenant</span></td>
<td>oncall</td><td>the provider&#39;s bad day</td>`)
	require.Contains(t, body, `<td><span class="mono">sha256:acme-doc</span></td>
<td>acme</td>`)
	require.NotContains(t, body, "csrf_token", "a read-only console has no invalidation form")
	require.NotContains(t, body, "invalidate-form")

	_, body = get(t, h, "/reuse?kind=invoice.extract")
	require.Equal(t, idsOf(every), invalidationIDs(body))
	require.Contains(t, body, `name="kind" value="invoice.extract"`, "the filter shows what it filters by")
	_, body = get(t, h, "/reuse?kind=no.such.kind")
	require.Empty(t, invalidationIDs(body))
	require.Contains(t, body, "No invalidations of this kind.")

	// Pages grow by a link until they hold everything.
	_, body = get(t, h, "/reuse?kind=doc.summarize&limit=2")
	require.Equal(t, idsOf(newest, globex), invalidationIDs(body))
	more := moreLink.FindStringSubmatch(body)
	require.NotNil(t, more, body)
	require.Equal(t, "/reuse?kind=doc.summarize&amp;limit=4", more[1])
	_, body = get(t, h, "/reuse?kind=doc.summarize&limit=4")
	require.Equal(t, idsOf(newest, globex, oldest), invalidationIDs(body))
	require.Nil(t, moreLink.FindStringSubmatch(body), "the last page offers no more")

	// acme's console: its own and every tenant's.
	acme := f.console(t, console.Config{Tenant: "acme"})
	code, body = get(t, acme, "/reuse")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, idsOf(newest, every, oldest), invalidationIDs(body))
	require.NotContains(t, body, "globex")
	_, body = get(t, acme, "/reuse?kind=doc.summarize&fragment=list")
	require.Equal(t, idsOf(newest, oldest), invalidationIDs(body))
	require.NotContains(t, body, "<header", "a fragment is the list alone")
}

var recordedLocation = regexp.MustCompile(`^/reuse\?covered=(\d+)&kind=([^&]+)&proof=([^&]+)&recorded=(\d+)$`)

// With actions on, the reuse page's form records an invalidation through
// jobs.PostgresStore.InvalidateReuse with the actor and the reason, logs
// it, and returns to the page showing what was recorded and how many
// results it covered; later claims no longer reuse those results. Bad
// input is a 400 naming the field, and writes nothing; so are a missing
// or foreign CSRF token, a request from another site and a missing actor
// (403). The count shown is the one the console wrote: a link cannot
// change it.
func TestReuseInvalidate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.seedReuse(t)
	var logs syncBuffer
	h := f.console(t, console.Config{EnableActions: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s := &session{t: t, h: h}
	code, body := s.get("/reuse?kind=doc.summarize")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<form class="reuse-form" method="post" action="/reuse/invalidate" id="invalidate-form">`)
	require.Contains(t, body, `<input name="kind" required maxlength="100" value="doc.summarize"`, "the kind filter fills the form")
	require.Contains(t, body, `<input name="tenant" maxlength="200" placeholder="every tenant">`)
	token := csrfFrom(t, body)
	user := http.Header{"X-Test-User": {"ops@example.com"}}
	valid := func(extra ...string) url.Values {
		v := url.Values{"csrf_token": {token}, "kind": {"doc.summarize"}, "key": {"sha256:acme-doc"}, "tenant": {"acme"}, "reason": {"prompt v3 summed wrong"}}
		for i := 0; i+1 < len(extra); i += 2 {
			v.Set(extra[i], extra[i+1])
		}
		return v
	}

	for field, form := range map[string]url.Values{
		"kind":     valid("kind", ""),
		"kind ":    valid("kind", "no spaces"),
		"key":      valid("key", "a\x01b"),
		"key ":     valid("key", strings.Repeat("k", 256)),
		"tenant":   valid("tenant", "a\tb"),
		"reason":   valid("reason", ""),
		"reason ":  valid("reason", "   "),
		"reason  ": valid("reason", strings.Repeat("r", 1001)),
	} {
		rec := s.post("/reuse/invalidate", form, user)
		require.Equal(t, http.StatusBadRequest, rec.Code, field)
		require.Contains(t, rec.Body.String(), strings.TrimSpace(field)+": ", field)
	}
	other := &session{t: t, h: h}
	_, otherBody := other.get("/reuse")
	for name, c := range map[string]struct {
		form   url.Values
		header http.Header
		want   string
	}{
		"no token":        {valid("csrf_token", ""), user, "csrf: the form carries no CSRF token"},
		"another's token": {valid("csrf_token", csrfFrom(t, otherBody)), user, "csrf: the CSRF token does not match"},
		"cross-site":      {valid(), http.Header{"X-Test-User": user["X-Test-User"], "Sec-Fetch-Site": {"cross-site"}}, "csrf: "},
		"foreign origin":  {valid(), http.Header{"X-Test-User": user["X-Test-User"], "Origin": {"https://evil.example"}}, "csrf: "},
		"no actor":        {valid(), nil, "actor: "},
	} {
		rec := s.post("/reuse/invalidate", c.form, c.header)
		require.Equal(t, http.StatusForbidden, rec.Code, name)
		require.Contains(t, rec.Body.String(), c.want, name)
	}
	require.Empty(t, f.invalidations(t), "a refused invalidation writes nothing")

	rec := s.post("/reuse/invalidate", valid(), user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	loc := recordedLocation.FindStringSubmatch(rec.Header().Get("Location"))
	require.NotNil(t, loc, rec.Header().Get("Location"))
	require.Equal(t, "1", loc[1], "acme's one computed result of the key (the reused one is no source)")
	require.Equal(t, "doc.summarize", loc[2], "back to the kind's invalidations")
	recorded := f.invalidations(t)
	require.Len(t, recorded, 1)
	inv := recorded[0]
	require.Equal(t, loc[4], itoa(inv.ID))
	require.Equal(t, jobs.ReuseInvalidation{ID: inv.ID, Kind: "doc.summarize", Key: "sha256:acme-doc", Tenant: "acme", At: inv.At,
		By: "ops@example.com", Reason: "prompt v3 summed wrong"}, inv)
	require.Contains(t, logs.String(), "console: reuse invalidated")
	require.Contains(t, logs.String(), "actor=ops@example.com invalidation="+itoa(inv.ID)+" kind=doc.summarize key=sha256:acme-doc tenant=acme covered=1")

	code, body = s.get(rec.Header().Get("Location"))
	require.Equal(t, http.StatusOK, code, body)
	section := regexp.MustCompile(`(?s)<section id="recorded">.*?</section>`).FindString(body)
	require.NotEmpty(t, section, body)
	for _, want := range []string{"#" + itoa(inv.ID), "<dd>doc.summarize</dd>", `<span class="mono">sha256:acme-doc</span>`, "<dd>acme</dd>",
		"<dd>ops@example.com</dd>", "<dd>prompt v3 summed wrong</dd>", `<b id="covered">1</b> computed result (`} {
		require.Contains(t, section, want)
	}
	require.Equal(t, []string{itoa(inv.ID)}, invalidationIDs(body), "and it is listed")

	// The key's result is no longer reused: the next job computes.
	next := f.reuseJob(t, "acme", r.tenantKey)
	require.Equal(t, uuid.Nil, next.ReusedFrom)

	// The count is the console's: another is refused, and so is a
	// malformed result.
	forged := strings.Replace(rec.Header().Get("Location"), "covered=1", "covered=9999", 1)
	for target, want := range map[string]string{
		forged:                        "proof: ",
		"/reuse?recorded=x":           "recorded: ",
		"/reuse?recorded=1&covered=-": "covered: ",
		"/reuse?recorded=1&covered=0": "proof: ",
	} {
		code, body := s.get(target)
		require.Equal(t, http.StatusBadRequest, code, target)
		require.Contains(t, body, want, target)
	}

	// An operator's console may invalidate every key and every tenant.
	rec = s.post("/reuse/invalidate", valid("key", "", "tenant", ""), user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	loc = recordedLocation.FindStringSubmatch(rec.Header().Get("Location"))
	require.NotNil(t, loc)
	require.Equal(t, "3", loc[1], "the kind's computed results of every tenant: acme's two and globex's")
	_, body = s.get(rec.Header().Get("Location"))
	require.Contains(t, body, "<dd>every key of the kind</dd>")
	require.Contains(t, body, "<dd>every tenant's results</dd>")
	recorded = f.invalidations(t)
	require.Len(t, recorded, 2)
	require.Empty(t, recorded[0].Key)
	require.Empty(t, recorded[0].Tenant)
}

// invalidations reads every recorded invalidation, newest first.
func (f *fixture) invalidations(t *testing.T) []jobs.ReuseInvalidation {
	t.Helper()
	list, err := f.store.ReuseInvalidations(t.Context(), f.pool, "", jobs.MaxListLimit)
	require.NoError(t, err)
	return list
}

// A tenant's console invalidates only its tenant's results: its form's
// tenant is fixed, a form without one is narrowed to the tenant rather
// than widened to every tenant, and a forged one naming another tenant is
// refused (403) and writes nothing. The result it returns to, and any
// other, is shown only if the tenant may read it.
func TestReuseInvalidateInATenantsConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedReuse(t)
	key := []byte("a key both consoles of this host share")
	acme := &session{t: t, h: f.console(t, console.Config{Tenant: "acme", EnableActions: true, CSRFKey: key})}
	_, body := acme.get("/reuse")
	require.Contains(t, body, `<input name="tenant" value="acme" readonly>`)
	token := csrfFrom(t, body)
	user := http.Header{"X-Test-User": {"acme-admin"}}
	form := func(tenant ...string) url.Values {
		return url.Values{"csrf_token": {token}, "kind": {"doc.summarize"}, "tenant": tenant, "reason": {"ours were wrong"}}
	}

	for name, tenants := range map[string][]string{"another tenant": {"globex"}, "another first": {"globex", "acme"}} {
		rec := acme.post("/reuse/invalidate", form(tenants...), user)
		require.Equal(t, http.StatusForbidden, rec.Code, name)
		require.Contains(t, rec.Body.String(), "tenant: this console invalidates only its own tenant&#39;s results", name)
	}
	require.Empty(t, f.invalidations(t), "a forged tenant writes nothing")

	for name, tenants := range map[string][]string{"its own": {"acme"}, "none": nil, "empty": {""}} {
		rec := acme.post("/reuse/invalidate", form(tenants...), user)
		require.Equal(t, http.StatusSeeOther, rec.Code, "%s: %s", name, rec.Body.String())
		loc := recordedLocation.FindStringSubmatch(rec.Header().Get("Location"))
		require.NotNil(t, loc, name)
		require.Equal(t, "1", loc[1], "%s: acme's one computed result, not globex's", name)
		list := f.invalidations(t)
		require.Equal(t, "acme", list[0].Tenant, name)
		require.Equal(t, "acme-admin", list[0].By, name)
		_, body = acme.get(rec.Header().Get("Location"))
		require.Contains(t, body, `<section id="recorded">`, name)
	}

	// An operator's invalidation of globex's results, and its result page
	// opened in acme's console (the same CSRF key signs both): acme sees
	// neither.
	operator := &session{t: t, h: f.console(t, console.Config{EnableActions: true, CSRFKey: key})}
	_, body = operator.get("/reuse")
	rec := operator.post("/reuse/invalidate", url.Values{"csrf_token": {csrfFrom(t, body)}, "kind": {"doc.summarize"}, "tenant": {"globex"},
		"reason": {"globex asked"}}, http.Header{"X-Test-User": {"ops"}})
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	code, body := acme.get(rec.Header().Get("Location"))
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, `<section id="recorded">`)
	require.NotContains(t, body, "globex")
	require.Len(t, invalidationIDs(body), 3, "acme's three only")
	_, body = operator.get("/reuse")
	require.Len(t, invalidationIDs(body), 4)
}

// A schema migrated before result reuse (to 0024) makes the reuse page and
// its action fail as every page does without its tables: a 500 naming the
// schema, the setting and the fix.
func TestReuseNeedsMigration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := &session{t: t, h: f.console(t, console.Config{EnableActions: true})}
	_, body := s.get("/reuse")
	token := csrfFrom(t, body)
	_, err := llmq.Migrate(t.Context(), f.pool, llmq.MigrateOptions{Schema: f.schema, Direction: llmq.DirectionDown, TargetVersion: 24})
	require.NoError(t, err)
	code, body := s.get("/batches")
	require.Equal(t, http.StatusOK, code, "the pages on older tables work: %s", body)
	code, body = s.get("/reuse")
	requireNotMigrated(t, code, body, f.schema)
	require.Contains(t, body, "job_reuse_invalidations", "the missing table is named")
	rec := s.post("/reuse/invalidate", url.Values{"csrf_token": {token}, "kind": {"doc.summarize"}, "reason": {"x"}}, http.Header{"X-Test-User": {"ops"}})
	requireNotMigrated(t, rec.Code, rec.Body.String(), f.schema)
	require.Contains(t, rec.Body.String(), "job_reuse_invalidations")
}

func requireNotMigrated(t *testing.T, code int, body, schema string) {
	t.Helper()
	require.Equal(t, http.StatusInternalServerError, code, body)
	require.Contains(t, body, "schema not migrated")
	require.Contains(t, body, "llmq migrate up -schema "+schema)
	require.Contains(t, body, "console.Config.Schema")
}
