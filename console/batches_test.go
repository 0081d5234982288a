package console_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/internal/dbtest"
)

// The batches page lists provider batch submissions newest first with
// their state, the provider's batch id and status, the settled counts, the
// age, a requested cancellation and the first line of the last error;
// filtered by pool, in pages that grow by a link.
func TestBatchesPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	code, body := get(t, h, "/batches")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `href="/batches" class="on"`, "the navigation has the page")
	require.Equal(t, []string{f.batches["preparing"].String(), f.batches["submitted"].String(), f.batches["claude"].String(), f.batches["ended"].String()},
		batchIDs(body), "newest first")

	submitted := batchRowOf(t, body, f.batches["submitted"])
	for _, want := range []string{"openai-gpt", "gpt-4o-mini", `s-submitted">submitted`, "batch_abc123", "in_progress"} {
		require.Contains(t, submitted, want)
	}
	require.Regexp(t, `>1h\dm0s ago<`, submitted, "its age")
	require.Contains(t, submitted, cells(120, 20, 2, 0, 4, 0), "requests, succeeded, failed, stale, returned, skipped")
	require.Regexp(t, `<td class="err" title="[^"]*">polling the provider: 502 bad gateway</td>`, submitted, "the first line of the last error")
	require.Contains(t, batchRowOf(t, body, f.batches["ended"]), cells(40, 35, 3, 1, 0, 1))
	require.Contains(t, batchRowOf(t, body, f.batches["claude"]), `<span class="tag warn">requested</span>`)
	preparing := batchRowOf(t, body, f.batches["preparing"])
	require.Contains(t, preparing, `<td class="mono">-</td><td>-</td>`, "no provider batch yet")
	require.NotContains(t, preparing, "requested")
	require.NotContains(t, body, "csrf_token", "a read-only console has no cancel forms")

	_, body = get(t, h, "/batches?pool=anthropic-claude")
	require.Equal(t, []string{f.batches["claude"].String()}, batchIDs(body))
	require.Contains(t, body, `name="pool" value="anthropic-claude"`, "the filter shows what it filters by")
	_, body = get(t, h, "/batches?pool=no+such+pool")
	require.Empty(t, batchIDs(body))
	require.Contains(t, body, "No provider batch submissions in this pool.")

	// Pages grow by a link until they hold everything.
	_, body = get(t, h, "/batches?pool=openai-gpt&limit=2")
	require.Equal(t, []string{f.batches["preparing"].String(), f.batches["submitted"].String()}, batchIDs(body))
	more := moreLink.FindStringSubmatch(body)
	require.NotNil(t, more, body)
	require.Equal(t, "/batches?limit=4&amp;pool=openai-gpt", more[1])
	_, body = get(t, h, "/batches?limit=4&pool=openai-gpt")
	require.Equal(t, []string{f.batches["preparing"].String(), f.batches["submitted"].String(), f.batches["ended"].String()}, batchIDs(body))
	require.Nil(t, moreLink.FindStringSubmatch(body), "the last page offers no more")

	// The largest page says so rather than offering more.
	_, err := f.pool.Exec(t.Context(), `INSERT INTO `+f.schema+`.provider_submissions (id, pool, provider, model, queue, requests, bytes, estimated_tokens)
		SELECT gen_random_uuid(), 'bulk', 'openai', 'gpt-4o-mini', 'batch', 1, 1, 1 FROM generate_series(1, 501)`)
	require.NoError(t, err)
	_, body = get(t, h, "/batches?pool=bulk&limit=500")
	require.Len(t, batchIDs(body), 500)
	require.Nil(t, moreLink.FindStringSubmatch(body))
	require.Contains(t, body, "the most this page lists")
}

var (
	batchIDCell = regexp.MustCompile(`<td class="mono" title="([0-9a-f-]{36})">`)
	moreLink    = regexp.MustCompile(`<a href="([^"]+)">Show more →</a>`)
)

// batchIDs returns the submission ids of a batches page, in its order.
func batchIDs(body string) []string {
	var ids []string
	for _, m := range batchIDCell.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// batchRowOf returns the table row of submission id.
func batchRowOf(t *testing.T, body string, id uuid.UUID) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr>\s*<td class="mono" title="` + id.String() + `">.*?</tr>`).FindString(body)
	require.NotEmpty(t, m, "no row for submission %s", id)
	return m
}

// cells is a row's six count cells, in the page's order.
func cells(counts ...int) string {
	var b strings.Builder
	for i, n := range counts {
		fmt.Fprintf(&b, `<td class="n">%d</td>`, n)
		if i == 2 {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// syncBuffer is a log destination that tests read while handlers write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// With actions on, an open submission's Cancel does what `llmq batches
// cancel` does: it marks the submission cancel_requested and brings its
// next poll forward, logged with the actor. The form needs the page's
// CSRF token and an actor; an unknown or ended submission is a 404, a
// malformed id a 400; nothing else is written.
func TestBatchCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var logs syncBuffer
	h := f.console(t, console.Config{EnableActions: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s := &session{t: t, h: h}
	_, body := s.get("/batches?pool=openai-gpt")
	token := csrfFrom(t, body)
	for name, open := range map[string]bool{"preparing": true, "submitted": true, "ended": false} {
		form := `action="/batches/` + f.batches[name].String() + `/cancel"`
		if open {
			require.Contains(t, body, form, "%s is open: it can be cancelled", name)
		} else {
			require.NotContains(t, body, form, "%s has ended", name)
		}
	}
	_, all := s.get("/batches")
	require.NotContains(t, all, `action="/batches/`+f.batches["claude"].String()+`/cancel"`, "its cancel was requested already")

	user := http.Header{"X-Test-User": {"ops@example.com"}}
	target := "/batches/" + f.batches["submitted"].String() + "/cancel"
	other := &session{t: t, h: h}
	_, otherBody := other.get("/batches")
	for name, c := range map[string]struct {
		form   url.Values
		header http.Header
		want   string
	}{
		"no token":        {url.Values{}, user, "csrf: the form carries no CSRF token"},
		"another's token": {url.Values{"csrf_token": {csrfFrom(t, otherBody)}}, user, "csrf: the CSRF token does not match"},
		"cross-site":      {url.Values{"csrf_token": {token}}, http.Header{"X-Test-User": user["X-Test-User"], "Sec-Fetch-Site": {"cross-site"}}, "csrf: "},
		"no actor":        {url.Values{"csrf_token": {token}}, nil, "actor: "},
	} {
		rec := s.post(target, c.form, c.header)
		require.Equal(t, http.StatusForbidden, rec.Code, name)
		require.Contains(t, rec.Body.String(), c.want, name)
	}
	require.False(t, f.cancelRequested(t, f.batches["submitted"]), "a refused cancel writes nothing")

	rec := s.post("/batches/nope/cancel", url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "id: ")
	rec = s.post(target, url.Values{"csrf_token": {token}, "pool": {"a\x01b"}}, user)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "pool: ")
	for _, id := range []uuid.UUID{uuid.Must(uuid.NewV7()), f.batches["ended"]} {
		rec = s.post("/batches/"+id.String()+"/cancel", url.Values{"csrf_token": {token}}, user)
		require.Equal(t, http.StatusNotFound, rec.Code, id)
		require.Contains(t, rec.Body.String(), "no open submission "+id.String())
	}
	require.False(t, f.cancelRequested(t, f.batches["ended"]))
	require.False(t, f.cancelRequested(t, f.batches["submitted"]))

	rec = s.post(target, url.Values{"csrf_token": {token}, "pool": {"openai-gpt"}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	require.Equal(t, "/batches?flash=batch-cancel&pool=openai-gpt", rec.Header().Get("Location"), "back to the list it was on")
	require.True(t, f.cancelRequested(t, f.batches["submitted"]))
	var due bool
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT next_poll_at <= now() FROM "+f.schema+".provider_submissions WHERE id = $1",
		f.batches["submitted"]).Scan(&due))
	require.True(t, due, "the submitter polls it next")
	require.False(t, f.cancelRequested(t, f.batches["preparing"]), "only that submission")
	require.Contains(t, logs.String(), "console: batch cancel requested")
	require.Contains(t, logs.String(), "actor=ops@example.com submission="+f.batches["submitted"].String())

	_, body = s.get(rec.Header().Get("Location"))
	require.Contains(t, body, "Cancel requested: the pool&#39;s submitter cancels the provider batch at its next poll")
	row := batchRowOf(t, body, f.batches["submitted"])
	require.Contains(t, row, "requested")
	require.NotContains(t, row, "<form", "a requested cancel is not offered again")
	// Asking again, from a page loaded before, is harmless, as in the CLI.
	rec = s.post(target, url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	require.Equal(t, "/batches?flash=batch-cancel", rec.Header().Get("Location"))
}

func (f *fixture) cancelRequested(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	var requested bool
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT cancel_requested FROM "+f.schema+".provider_submissions WHERE id = $1", id).Scan(&requested))
	return requested
}

// A schema without the provider batch tables (migrated only to 0022, or
// never) makes the batches page and its action fail with the error every
// page gives for a missing table: a 500 naming the schema, the setting and
// the command that fixes it, rather than PostgreSQL's "relation does not
// exist" in the log only.
func TestBatchesNeedMigration(t *testing.T) {
	t.Parallel()
	requireFix := func(t *testing.T, code int, body, schema string) {
		t.Helper()
		require.Equal(t, http.StatusInternalServerError, code, body)
		require.Contains(t, body, "schema not migrated")
		require.Contains(t, body, "llmq migrate up -schema "+schema)
		require.Contains(t, body, "console.Config.Schema")
	}
	t.Run("0022", func(t *testing.T) {
		t.Parallel()
		// A schema migrated before the provider batch tables came: a
		// fixture's, taken back to 0022 after the page gave its form.
		f := newFixture(t)
		s := &session{t: t, h: f.console(t, console.Config{EnableActions: true})}
		_, body := s.get("/batches")
		token := csrfFrom(t, body)
		_, err := llmq.Migrate(t.Context(), f.pool, llmq.MigrateOptions{Schema: f.schema, Direction: llmq.DirectionDown, TargetVersion: 22})
		require.NoError(t, err)
		code, body := s.get("/jobs")
		require.Equal(t, http.StatusOK, code, "the pages on older tables work: %s", body)
		code, body = s.get("/batches")
		requireFix(t, code, body, f.schema)
		require.Contains(t, body, "provider_submissions", "the missing table is named")
		rec := s.post("/batches/"+f.batches["submitted"].String()+"/cancel", url.Values{"csrf_token": {token}}, http.Header{"X-Test-User": {"ops"}})
		requireFix(t, rec.Code, rec.Body.String(), f.schema)
	})
	t.Run("never", func(t *testing.T) {
		t.Parallel()
		db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
		h, err := console.New(console.Config{DB: db.Pool, Schema: db.Schema})
		require.NoError(t, err)
		for _, path := range []string{"/batches", "/", "/jobs", "/dead", "/pools", "/tenants", "/reuse", "/jobs/" + uuid.NewString()} {
			code, body := get(t, h, path)
			requireFix(t, code, body, db.Schema)
		}
	})
}
