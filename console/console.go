package console

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/providerbatch"
	"github.com/llmq/llmq/schedule"
)

//go:embed queries.sql
var queriesSQL string

//go:embed templates/*.html static/*
var assets embed.FS

// DBTX is what the console reads and writes through: a *pgxpool.Pool in
// practice (the console runs each read on its own, never in a caller's
// transaction).
type DBTX = jobs.DBTX

// Defaults of Config's zero values.
const (
	DefaultRefreshInterval = 5 * time.Second
	DefaultScanLimit       = 20_000
	DefaultCountCap        = 10_000
	DefaultPageSize        = 50
)

// Config configures the console. DB is required; every other zero value
// means the documented default.
type Config struct {
	// DB is the database holding the llmq schema. Required.
	DB DBTX
	// Schema holds the llmq tables. Default "llmq".
	Schema string
	// Tenant scopes the console to one tenant: every page, count, chart
	// and action sees only that tenant's jobs and usage, and the pages
	// about shared infrastructure (provider pools' live state, runners,
	// relays, the outbox) are left out. Empty means every tenant (an
	// operator's console).
	Tenant string
	// BasePath is where the host mounts the handler, such as "/console";
	// links are built under it and it is stripped from request paths. It
	// must be a clean absolute path (segments of letters, digits, '.', '_',
	// '~' and '-'; no "//", "." or ".." segments, no trailing "/"), since
	// it goes into every link as it is. Default "" (the root).
	BasePath string
	// EnableActions allows the console's writes: replaying dead-lettered
	// and REVIEW_REQUIRED jobs, invalidating reusable results (with Tenant,
	// only that tenant's), and (without Tenant) changing provider pools'
	// limits and cancelling provider batch submissions. Default false: the
	// console only reads.
	EnableActions bool
	// Actor names the person behind a request, as the host's own
	// authentication established it; the console records it with every
	// action (a replay's replayed_by, an invalidation's invalidated_by, a
	// log line for a pool change or a batch cancellation).
	// Required when EnableActions is set; an action whose Actor returns ""
	// is refused (403).
	Actor func(r *http.Request) string
	// CSRFKey signs the anti-CSRF tokens of action forms. Replicas behind
	// one load balancer need the same key. Default: 32 random bytes drawn
	// by New (tokens then last as long as the process).
	CSRFKey []byte
	// TrustedOrigins are origins ("https://ops.example.com") whose actions
	// are accepted even when the browser does not say the request is
	// same-origin (Sec-Fetch-Site) and its Origin does not match the Host
	// the console sees: list the console's public origin when a reverse
	// proxy rewrites Host and older browsers must act. Default none.
	TrustedOrigins []string
	// SecureCookie marks the CSRF cookie Secure (sent over HTTPS only).
	// The console does so by itself when it serves TLS; set it when
	// browsers reach it over HTTPS through a proxy that terminates TLS,
	// which the console cannot see. Default false.
	SecureCookie bool
	// RefreshInterval is how often pages refresh their live parts. Default
	// 5s; negative turns refreshing off.
	RefreshInterval time.Duration
	// ScanLimit bounds the rows a listing reads per request; a page that
	// fills up within it ends with a "continue" link. Default 20,000.
	ScanLimit int
	// CountCap is where counts stop: a count that reaches it shows as
	// "10,000+". Default 10,000.
	CountCap int
	// Queues names queues to show even before they have had work. The
	// console also finds every queue that has had work by itself.
	Queues []string
	// Logger receives the actions taken and the errors served. Nil means
	// slog.Default().
	Logger *slog.Logger
	// Health holds where the overview's Health figures turn warning
	// (amber) and critical (red). The zero value means the documented
	// defaults (see Thresholds).
	Health Thresholds
}

// Handler is the console. It is an http.Handler safe for concurrent use.
type Handler struct {
	cfg     Config
	sql     statements
	store   *jobs.PostgresStore
	limiter *admission.Postgres
	batches *providerbatch.Operator
	// schedules reads and pauses the schedules (package schedule).
	schedules *schedule.Store
	pages     map[string]*template.Template
	static    http.Handler
	mux       *http.ServeMux
	origins   *http.CrossOriginProtection
	// chartCap is DefaultChartCap and eventScanLimit
	// DefaultEventScanLimit; tests lower them.
	chartCap, eventScanLimit int
}

// ErrInvalidConfig is wrapped by New's errors.
var ErrInvalidConfig = errors.New("console: invalid config")

func invalidConfig(field, problem string) error {
	return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, problem)
}

// New validates cfg and returns the console's handler.
func New(cfg Config) (http.Handler, error) {
	return newHandler(cfg)
}

func newHandler(cfg Config) (*Handler, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	var sql statements
	if _, err := sql.load(schema); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	cfg.Schema = schema.Name()
	store, err := jobs.NewStore(jobs.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	limiter, err := admission.NewPostgres(cfg.DB, admission.Config{Schema: cfg.Schema, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	batches, err := providerbatch.NewOperator(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	schedules, err := schedule.NewStore(schedule.StoreConfig{Schema: cfg.Schema})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	origins := http.NewCrossOriginProtection()
	for _, o := range cfg.TrustedOrigins {
		if err := origins.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("%w: TrustedOrigins: %w", ErrInvalidConfig, err)
		}
	}
	h := &Handler{cfg: cfg, sql: sql, store: store, limiter: limiter, batches: batches, schedules: schedules, pages: pages, origins: origins, chartCap: DefaultChartCap, eventScanLimit: DefaultEventScanLimit}
	if h.static, err = staticFiles(); err != nil {
		return nil, err
	}
	h.routes()
	return h, nil
}

func withDefaults(cfg Config) (Config, error) {
	switch {
	case cfg.DB == nil:
		return cfg, invalidConfig("DB", "is required")
	case cfg.EnableActions && cfg.Actor == nil:
		return cfg, invalidConfig("Actor", "is required when EnableActions is set: actions are recorded with who took them")
	case cfg.ScanLimit < 0 || cfg.CountCap < 0:
		return cfg, invalidConfig("ScanLimit/CountCap", "must not be negative")
	case !validBasePath(cfg.BasePath):
		return cfg, invalidConfig("BasePath", fmt.Sprintf("%q is not a clean absolute path such as /ops/console (segments of letters, digits, '.', '_', '~' and '-'; no // , . or .. segments, no trailing /)", cfg.BasePath))
	case len(cfg.CSRFKey) > 0 && len(cfg.CSRFKey) < 16:
		return cfg, invalidConfig("CSRFKey", "must hold at least 16 bytes")
	}
	if cfg.Tenant != "" {
		if p := validate.Text(cfg.Tenant, true, jobs.MaxTenantLen); p != "" {
			return cfg, invalidConfig("Tenant", p)
		}
	}
	for _, q := range cfg.Queues {
		if !validQueue(q) {
			return cfg, invalidConfig("Queues", fmt.Sprintf("%q is not a queue name", q))
		}
	}
	health, err := cfg.Health.withDefaults()
	if err != nil {
		return cfg, err
	}
	cfg.Health = health
	if len(cfg.CSRFKey) == 0 {
		cfg.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(cfg.CSRFKey); err != nil {
			return cfg, fmt.Errorf("console: drawing a CSRF key: %w", err)
		}
	}
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, DefaultRefreshInterval)
	cfg.ScanLimit = cmp.Or(cfg.ScanLimit, DefaultScanLimit)
	cfg.CountCap = cmp.Or(cfg.CountCap, DefaultCountCap)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return cfg, nil
}

var basePathPattern = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)+$`)

// validBasePath reports whether p can prefix the console's links and its
// cookie's path: "" (the root), or a clean absolute path. A leading "//"
// would make every link protocol-relative (//evil.example/jobs is another
// host), and "." or ".." segments, escapes or separators would make links
// and the path the console strips disagree.
func validBasePath(p string) bool {
	return p == "" || (basePathPattern.MatchString(p) && path.Clean(p) == p)
}

func (h *Handler) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", h.page("overview", h.overview))
	m.HandleFunc("GET /tenants", h.page("tenants", h.tenants))
	m.HandleFunc("GET /jobs", h.page("jobs", h.jobList))
	m.HandleFunc("GET /jobs/{id}", h.page("job", h.jobPage))
	m.HandleFunc("POST /jobs/{id}/replay", h.action(h.replay))
	m.HandleFunc("GET /dead", h.page("dead", h.deadList))
	m.HandleFunc("GET /pools", h.page("pools", h.poolsPage))
	m.HandleFunc("POST /pools/{name}", h.action(h.setPool))
	m.HandleFunc("GET /batches", h.page("batches", h.batchesPage))
	m.HandleFunc("POST /batches/{id}/cancel", h.action(h.cancelBatch))
	m.HandleFunc("GET /reuse", h.page("reuse", h.reusePage))
	m.HandleFunc("GET /schedules", h.page("schedules", h.schedulesPage))
	m.HandleFunc("POST /schedules/{name}/pause", h.action(h.pauseSchedule))
	m.HandleFunc("POST /schedules/{name}/resume", h.action(h.resumeSchedule))
	m.HandleFunc("POST /reuse/invalidate", h.action(h.invalidateReuse))
	m.Handle("GET /static/", h.static)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, &httpError{status: http.StatusNotFound, msg: "no such page: " + r.URL.Path})
	})
	h.mux = m
}

// staticFiles serves the embedded static files by their exact names
// (/static/console.css, /static/console.js) and nothing else: no listing,
// no other path of the embedded tree (the templates), whatever its
// escapes; anything else is a 404.
func staticFiles() (http.Handler, error) {
	entries, err := fs.ReadDir(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("console: static files: %w", err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := fs.ReadFile(assets, "static/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("console: static files: %w", err)
		}
		files[e.Name()] = b
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, "/static/")
		b, found := files[name]
		if !ok || !found || r.URL.RawPath != "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", mime.TypeByExtension(path.Ext(name)))
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	}), nil
}

// ServeHTTP serves the console's pages under Config.BasePath.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.cfg.BasePath != "" {
		rest, ok := strings.CutPrefix(r.URL.Path, h.cfg.BasePath)
		if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
			http.NotFound(w, r)
			return
		}
		if rest == "" {
			http.Redirect(w, r, h.cfg.BasePath+"/", http.StatusMovedPermanently)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		// The base path holds no character that escapes differently, so
		// the escaped path loses the same prefix: a path segment with an
		// escaped "/" (a pool's name) stays one segment.
		r2.URL.RawPath = ""
		if raw, ok := strings.CutPrefix(r.URL.RawPath, h.cfg.BasePath); ok && raw != "" {
			r2.URL.RawPath = raw
		}
		r = r2
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	h.mux.ServeHTTP(w, r)
}
