package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/console"
)

// The browser tests drive Debian's chromium headless through chromedp.
// Chromium is a test dependency like PostgreSQL: scripts/services (the
// first step of make test) installs it when missing, and a machine without
// it fails these tests with a message saying how to get it. Set
// LLMQ_CHROMIUM to use another binary, LLMQ_CONSOLE_SCREENSHOTS to keep the
// screenshots in a directory of your choice (they go to the test's temp
// dir otherwise), or LLMQ_SKIP_BROWSER=1 to skip them on purpose.

func chromiumPath(t *testing.T) string {
	t.Helper()
	if os.Getenv("LLMQ_SKIP_BROWSER") == "1" {
		t.Skip("LLMQ_SKIP_BROWSER=1: the browser tests are skipped on request")
	}
	if p := os.Getenv("LLMQ_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium found for the console's browser tests: install Debian's chromium (as root: apt-get install -y chromium, " +
		"or run scripts/services, which make test runs first), set LLMQ_CHROMIUM to a Chrome binary, " +
		"or set LLMQ_SKIP_BROWSER=1 to skip these tests on purpose")
	return ""
}

// browser is a headless chromium with a fresh profile, recording every
// console error and uncaught exception of the pages it shows.
type browser struct {
	t        *testing.T
	ctx      context.Context
	mu       sync.Mutex
	problems []string
	shots    string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := chromiumPath(t)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	b := &browser{t: t, ctx: ctx, shots: os.Getenv("LLMQ_CONSOLE_SCREENSHOTS")}
	if b.shots == "" {
		b.shots = filepath.Join(t.TempDir(), "screenshots")
	}
	require.NoError(t, os.MkdirAll(b.shots, 0o755))
	// Start the browser and the tab now, so that the console is watched
	// from the first page on.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "starting chromium at %s", path)
	var wg sync.WaitGroup
	wg.Go(func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				b.mu.Lock()
				b.problems = append(b.problems, fmt.Sprintf("%s: %s", m.Type, m.Text))
				b.mu.Unlock()
			}
		}
	})
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancelCtx()
		cancelAlloc()
		wg.Wait()
		t.Logf("screenshots in %s", b.shots)
	})
	return b
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, steps...))
}

// navigates runs an action that loads another page and waits for it.
func (b *browser) navigates(step chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	res, err := chromedp.RunResponse(ctx, step)
	require.NoError(b.t, err)
	require.Equal(b.t, http.StatusOK, int(res.Status), res.URL)
}

func run[T any](b *browser, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(b.t, err)
	return v
}

func (b *browser) screenshot(name string) {
	b.t.Helper()
	png := run(b, chromedp.FullScreenshot(100))
	require.NoError(b.t, os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644))
}

func (b *browser) requireNoConsoleErrors(page string) {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(b.t, b.problems, "console errors on %s", page)
}

// Every page loads in a real browser without a console error (CSP
// violations included), refreshes its live parts, and is photographed.
func TestBrowserPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := httptest.NewServer(f.console(t, console.Config{EnableActions: true, RefreshInterval: 300 * time.Millisecond,
		Actor: func(*http.Request) string { return "browser-test" }}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)
	for _, p := range []struct{ name, path, want string }{
		{"overview", "/", "Live work by queue"},
		{"tenants", "/tenants", "Running / cap"},
		{"jobs", "/jobs", "invoice.extract"},
		{"job", "/jobs/" + f.dead["acme"].String(), "Attempts"},
		{"dead", "/dead", "Dead letters"},
		{"review", "/dead?state=REVIEW_REQUIRED", "Awaiting review"},
		{"admission", "/pools", "Provider pools"},
		{"batches", "/batches", "batch_abc123"},
		{"reuse", "/reuse", "Invalidations"},
	} {
		b.do(chromedp.Navigate(srv.URL+p.path), chromedp.WaitVisible(chromedp.CSS("main")))
		require.Contains(t, run(b, chromedp.Text(chromedp.CSS("main"))), p.want, p.path)
		if n := run(b, chromedp.Evaluate[int](`document.querySelectorAll("[data-fragment]").length`)); n > 0 {
			// The page's script replaced its live parts at least once.
			b.do(chromedp.WaitVisible(chromedp.CSS("[data-fragment][data-refreshed]")))
		}
		b.screenshot(p.name)
		b.requireNoConsoleErrors(p.path)
	}
}

// Filters narrow the jobs list, and a replay made through the form
// creates the linked job, end to end in the browser.
func TestBrowserFilterAndReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := httptest.NewServer(f.console(t, console.Config{EnableActions: true, RefreshInterval: -1,
		Actor: func(*http.Request) string { return "browser-test" }}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	b.do(chromedp.Navigate(srv.URL+"/jobs"), chromedp.WaitVisible(chromedp.CSS("#job-filters")),
		chromedp.SetValue(chromedp.CSS(`select[name="state"]`), "FAILED_TERMINAL"),
		chromedp.SendKeys(chromedp.CSS(`input[name="tenant"]`), "globex"))
	b.navigates(chromedp.Submit(chromedp.CSS("#job-filters")))
	require.Contains(t, run(b, chromedp.Location()), "state=FAILED_TERMINAL")
	states := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.list tbody .state")].map(e => e.textContent)`))
	require.Equal(t, []string{"FAILED_TERMINAL"}, states, "only globex's dead letter")
	tenants := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.list tbody tr td:nth-child(2)")].map(e => e.textContent)`))
	require.Equal(t, []string{"globex"}, tenants)
	b.screenshot("jobs-filtered")

	b.navigates(chromedp.Click(chromedp.CSS(`table.list tbody a.mono`)))
	b.do(chromedp.WaitVisible(chromedp.CSS("#replay-form")),
		chromedp.SendKeys(chromedp.CSS(`#replay-form input[name="reason"]`), "the provider is back"))
	b.navigates(chromedp.Click(chromedp.CSS(`#replay-form button`)))
	b.do(chromedp.WaitVisible(chromedp.CSS(".flash")))
	flash := run(b, chromedp.Text(chromedp.CSS(".flash")))
	require.Contains(t, flash, "Replayed as a new job")
	main := run(b, chromedp.Text(chromedp.CSS("main")))
	require.Contains(t, main, "browser-test")
	require.Contains(t, main, "the provider is back")
	b.screenshot("replayed")

	var by, reason string
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT replayed_by, replay_reason FROM "+f.schema+".jobs WHERE replay_of = $1",
		f.dead["globex"]).Scan(&by, &reason))
	require.Equal(t, "browser-test", by)
	require.Equal(t, "the provider is back", reason)
	require.True(t, strings.HasPrefix(run(b, chromedp.Location()), srv.URL+"/jobs/"))
	b.requireNoConsoleErrors("filter and replay")
}

// The batches page's pool filter narrows the list, and Cancel, through its
// form, requests the submission's cancellation, end to end in the browser.
func TestBrowserBatchCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := httptest.NewServer(f.console(t, console.Config{EnableActions: true, RefreshInterval: -1,
		Actor: func(*http.Request) string { return "browser-test" }}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	b.do(chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("main")))
	b.navigates(chromedp.Click(chromedp.CSS(`header nav a[href="/batches"]`)))
	b.do(chromedp.WaitVisible(chromedp.CSS("#batch-filters")),
		chromedp.SendKeys(chromedp.CSS(`#batch-filters input[name="pool"]`), "openai-gpt"))
	b.navigates(chromedp.Submit(chromedp.CSS("#batch-filters")))
	require.Contains(t, run(b, chromedp.Location()), "pool=openai-gpt")
	pools := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#batches tbody tr td:nth-child(2)")].map(e => e.textContent)`))
	require.Equal(t, []string{"openai-gpt", "openai-gpt", "openai-gpt"}, pools, "the pool's submissions only")
	b.screenshot("batches-filtered")

	id := f.batches["submitted"].String()
	b.navigates(chromedp.Click(chromedp.CSS(`form[action="/batches/` + id + `/cancel"] button`)))
	b.do(chromedp.WaitVisible(chromedp.CSS(".flash")))
	require.Contains(t, run(b, chromedp.Text(chromedp.CSS(".flash"))), "Cancel requested")
	require.Contains(t, run(b, chromedp.Location()), "pool=openai-gpt", "back to the filtered list")
	require.Zero(t, run(b, chromedp.Evaluate[int](`document.querySelectorAll('form[action="/batches/`+id+`/cancel"]').length`)),
		"a requested cancel is not offered again")
	b.screenshot("batch-cancelled")
	require.True(t, f.cancelRequested(t, f.batches["submitted"]))
	b.requireNoConsoleErrors("batch cancel")
}

// The reuse page's form records an invalidation and the page shows what
// was recorded and how many results it covered, end to end in the
// browser; the job whose result it covered then computes again.
func TestBrowserReuseInvalidate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.seedReuse(t)
	srv := httptest.NewServer(f.console(t, console.Config{EnableActions: true, RefreshInterval: -1,
		Actor: func(*http.Request) string { return "browser-test" }}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)

	b.do(chromedp.Navigate(srv.URL+"/jobs/"+r.reused.ID.String()), chromedp.WaitVisible(chromedp.CSS("#reused-from")))
	require.Contains(t, run(b, chromedp.Text(chromedp.CSS("#reused-from"))), "reused the result of")
	b.screenshot("job-reused")
	b.navigates(chromedp.Click(chromedp.CSS(`header nav a[href="/reuse"]`)))
	b.do(chromedp.WaitVisible(chromedp.CSS("#invalidate-form")),
		chromedp.SendKeys(chromedp.CSS(`#invalidate-form input[name="kind"]`), "doc.summarize"),
		chromedp.SendKeys(chromedp.CSS(`#invalidate-form input[name="key"]`), r.tenantKey.Key),
		chromedp.SendKeys(chromedp.CSS(`#invalidate-form input[name="tenant"]`), "acme"),
		chromedp.SendKeys(chromedp.CSS(`#invalidate-form input[name="reason"]`), "prompt v3 summed wrong"))
	b.navigates(chromedp.Click(chromedp.CSS(`#invalidate-form button`)))
	b.do(chromedp.WaitVisible(chromedp.CSS("#recorded")))
	recorded := run(b, chromedp.Text(chromedp.CSS("#recorded")))
	for _, want := range []string{"doc.summarize", r.tenantKey.Key, "acme", "browser-test", "prompt v3 summed wrong"} {
		require.Contains(t, recorded, want)
	}
	require.Equal(t, "1", run(b, chromedp.Text(chromedp.CSS("#covered"))), "acme's computed result of the key")
	rows := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#invalidations tbody tr td:nth-child(6)")].map(e => e.textContent)`))
	require.Equal(t, []string{"browser-test"}, rows, "and it is listed")
	b.screenshot("reuse-invalidated")

	list := f.invalidations(t)
	require.Len(t, list, 1)
	require.Equal(t, "browser-test", list[0].By)
	require.Equal(t, "acme", list[0].Tenant)
	require.Equal(t, uuid.Nil, f.reuseJob(t, "acme", r.tenantKey).ReusedFrom, "the result is not reused again")
	b.requireNoConsoleErrors("reuse invalidate")
}
