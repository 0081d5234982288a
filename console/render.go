package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// httpError is a refusal with its status and a message for people; for bad
// input the message starts with the field's name.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// badInput is a 400 naming field.
func badInput(field, problem string) error {
	return &httpError{status: http.StatusBadRequest, msg: field + ": " + problem}
}

// view is what every page template receives.
type view struct {
	Title    string
	Nav      string // the page's nav entry
	Base     string // Config.BasePath
	Tenant   string // the scoped tenant; "" for every tenant
	Actions  bool
	CSRF     string
	Refresh  int // milliseconds; 0 for none
	Now      time.Time
	Flash    string
	Data     any
	ErrorMsg string
	Status   int
}

// loader builds a page's data, or an error (an *httpError for refusals).
type loader func(ctx context.Context, r *http.Request, v *view) error

// page serves a GET page: the whole page, or with ?fragment=NAME only the
// template NAME of the page, which the page script polls for refreshes.
func (h *Handler) page(name string, load loader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := checkParams(r.URL.Query()); err != nil {
			h.fail(w, r, err)
			return
		}
		v := h.newView(w, r, name)
		if err := load(r.Context(), r, v); err != nil {
			h.fail(w, r, err)
			return
		}
		tmpl := "layout"
		if f := r.URL.Query().Get("fragment"); f != "" {
			if !fragmentName.MatchString(f) || h.pages[name].Lookup("fragment-"+f) == nil {
				h.fail(w, r, badInput("fragment", fmt.Sprintf("%q is not a part of this page", f)))
				return
			}
			tmpl = "fragment-" + f
		}
		h.render(w, r, name, tmpl, http.StatusOK, v)
	}
}

// flashes are the messages an action's redirect can show.
var flashes = map[string]string{
	"replayed":         "Replayed as a new job.",
	"replayed-before":  "This job was replayed before: here is that replay (tick \"again\" for another).",
	"pool-updated":     "Pool limits updated.",
	"batch-cancel":     "Cancel requested: the pool's submitter cancels the provider batch at its next poll, and the jobs the provider did not answer return to waiting.",
	"schedule-paused":  "Schedule paused: it enqueues nothing until resumed.",
	"schedule-resumed": "Schedule resumed: its next slot is the first after now; the slots missed while paused are skipped.",
}

var fragmentName = regexp.MustCompile(`^[a-z]{1,30}$`)

func (h *Handler) newView(w http.ResponseWriter, r *http.Request, nav string) *view {
	v := &view{Nav: nav, Base: h.cfg.BasePath, Tenant: h.cfg.Tenant, Actions: h.cfg.EnableActions, Now: time.Now()}
	if h.cfg.RefreshInterval > 0 {
		v.Refresh = int(h.cfg.RefreshInterval.Milliseconds())
	}
	if h.cfg.EnableActions {
		v.CSRF = h.csrfToken(w, r)
	}
	// The flash names one of the console's own messages, so a link from
	// elsewhere cannot put words on the page.
	v.Flash = flashes[r.URL.Query().Get("flash")]
	return v
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, page, tmpl string, status int, v *view) {
	var buf bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&buf, tmpl, v); err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "console: rendering a page", "page", page, "err", err)
		http.Error(w, "console: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail answers an error: its own status and message for an *httpError or
// a validation error of the packages, 404 for a job not found, 500 saying
// the fix for a schema without the tables a page reads, else 500 (the
// cause is logged, not shown).
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	err = h.explain(err)
	status, msg := classify(err)
	if status >= 500 {
		h.cfg.Logger.ErrorContext(r.Context(), "console: serving a request", "path", r.URL.Path, "err", err)
	}
	if r.URL.Query().Get("fragment") != "" {
		// The refreshing script keeps the part it has and marks it stale.
		http.Error(w, msg, status)
		return
	}
	v := &view{Nav: "error", Base: h.cfg.BasePath, Tenant: h.cfg.Tenant, Now: time.Now(), ErrorMsg: msg, Status: status,
		Title: http.StatusText(status)}
	h.render(w, r, "error", "layout", status, v)
}

// explain turns a missing table into a *llmqtype.NotMigratedError naming
// the console's schema and setting: the schema was never migrated, or not
// to the version a page reads (the batches page's tables came with
// migration 0023 and the reuse page's with 0025, so a schema left behind
// an upgrade fails there first).
// The operator reading the page is the one who can fix it, and the
// generic 500 would send them to the log for a cause the console knows. An
// explanation a package made already names that package's setting; the
// console's own (Config.Schema) is the one to check, so it is made again
// from the database's error.
func (h *Handler) explain(err error) error {
	var nm *llmqtype.NotMigratedError
	if errors.As(err, &nm) {
		err = nm.Err
	}
	return dbsql.Explain(err, h.cfg.Schema, "console.Config.Schema")
}

func classify(err error) (int, string) {
	var he *httpError
	var ve *validate.Error // jobs' and admission's ValidationError
	var nm *llmqtype.NotMigratedError
	switch {
	case errors.As(err, &he):
		return he.status, he.msg
	case errors.As(err, &nm):
		return http.StatusInternalServerError, nm.Error()
	case errors.As(err, &ve):
		return http.StatusBadRequest, ve.Field + ": " + ve.Problem
	case errors.Is(err, jobs.ErrNotReplayable):
		return http.StatusConflict, "this job cannot be replayed: " + err.Error()
	case errors.Is(err, jobs.ErrNotFound):
		return http.StatusNotFound, "no such job"
	case errors.Is(err, context.Canceled):
		return 499, "request cancelled"
	}
	return http.StatusInternalServerError, "console: the database could not answer; see the server log"
}

func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("base").Funcs(funcs).ParseFS(assets, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "tenants", "jobs", "job", "dead", "pools", "batches", "reuse", "schedules", "error"} {
		t, err := base.Clone()
		if err == nil {
			t, err = t.ParseFS(assets, "templates/"+name+".html")
		}
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

var funcs = template.FuncMap{
	"num":        formatNumber,
	"seg":        pathSegment,
	"routable":   routableName,
	"errorShown": func(s jobs.State) bool { return s != jobs.StateSucceeded },
	"terminal":   func(s jobs.State) bool { return s.Terminal() },
	"capped":     formatCapped,
	"ago":        ago,
	"dur":        formatDuration,
	"pct":        func(f float64) string { return strconv.FormatFloat(f*100, 'f', -1, 64) + "%" },
	"ts":         timestamp,
	"short":      shortID,
	"trunc":      truncate,
	"micro":      formatMicro,
	"lower":      strings.ToLower,
	"mul":        func(a, b int) int { return a * b },
	"add":        func(a, b int) int { return a + b },
	"int64":      func(n int) int64 { return int64(n) },
	"rows": func(base string, jobs []jobSummary) any {
		return struct {
			Base string
			Jobs []jobSummary
		}{base, jobs}
	},
	"join": strings.Join,
	"contains": func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	},
}

// formatNumber writes any integer (or a float, rounded) as formatCount
// does: one number format on every page.
func formatNumber(v any) string {
	switch n := v.(type) {
	case int:
		return formatCount(int64(n))
	case int16:
		return formatCount(int64(n))
	case int32:
		return formatCount(int64(n))
	case int64:
		return formatCount(n)
	case float64:
		return formatCount(int64(math.Round(n)))
	case float32:
		return formatCount(int64(math.Round(float64(n))))
	}
	return fmt.Sprint(v)
}

// pathSegment escapes a value for one segment of a link's path
// (url.PathEscape: "/", "?", "#" and "%" escaped), so data never adds a
// segment; "." and ".." are escaped too, though a browser still resolves
// "%2E" as a dot segment: the handlers refuse such names
// (routableName).
func pathSegment(v any) string {
	return url.PathEscape(fmt.Sprint(v))
}

// routableName reports whether a name can be a link's path segment:
// escaped, every name can except "", "." and "..", which a browser
// resolves as dot segments even escaped.
func routableName(s string) bool {
	return s != "" && s != "." && s != ".."
}

// formatCount writes n with thousands separators.
func formatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// count is a count that stops at a cap. More says that it is a lower
// bound for another reason (a bounded walk stopped before the end).
type count struct {
	N    int64
	Cap  int64
	More bool
}

func formatCapped(c count) string {
	switch {
	case c.Cap > 0 && c.N >= c.Cap:
		return formatCount(c.Cap) + "+"
	case c.More:
		return formatCount(c.N) + "+"
	}
	return formatCount(c.N)
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + formatDuration(-d)
	}
	return formatDuration(d) + " ago"
}

func formatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

func timestamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func shortID(s fmt.Stringer) string {
	v := s.String()
	if len(v) > 13 {
		return v[:8] + "…" + v[len(v)-4:]
	}
	return v
}

func truncate(n int, s string) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// formatMicro writes micro-units (the usage ledger's cost, the pools'
// prices) as units of the pools' price currency with two decimals and
// thousands separators, as formatCount writes counts.
func formatMicro(v int64) string {
	neg := v < 0
	if neg {
		v = -v
	}
	cents := (v + 5_000) / 10_000
	s := fmt.Sprintf("%s.%02d", formatCount(cents/100), cents%100)
	if neg {
		return "-" + s
	}
	return s
}
