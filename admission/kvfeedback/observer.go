package kvfeedback

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed lease.sql
var leaseSQL string

// The metrics an Observer reads, by vLLM's names.
const (
	MetricWaiting     = "vllm:num_requests_waiting"
	MetricRunning     = "vllm:num_requests_running"
	MetricKVUsage     = "vllm:kv_cache_usage_perc"
	MetricGPUUsage    = "vllm:gpu_cache_usage_perc" // the older name of MetricKVUsage
	MetricPreemptions = "vllm:num_preemptions_total"
	MetricTTFTSum     = "vllm:time_to_first_token_seconds_sum"
	MetricTTFTCount   = "vllm:time_to_first_token_seconds_count"
)

// Limiter is what an Observer changes: admission.Postgres (every process
// sees the budget) or admission.Local.
type Limiter interface {
	State(ctx context.Context, pool string) (admission.PoolState, error)
	SetPool(ctx context.Context, p admission.Pool) error
}

// ErrInvalidConfig is matched by every error New returns for a bad Config.
var ErrInvalidConfig = errors.New("kvfeedback: invalid configuration")

// Config configures an Observer. Pool, MetricsURL and Ceiling are
// required; the rest have defaults.
type Config struct {
	// Pool is the admission pool of the server.
	Pool string
	// MetricsURL is the server's Prometheus endpoint, e.g.
	// http://127.0.0.1:8000/metrics.
	MetricsURL string
	// Model keeps only the series labelled model_name=Model, for a server
	// that serves several; "" sums them all.
	Model string
	// Ceiling is the configured budget in tokens: the budget never goes
	// above it.
	Ceiling int64
	// Floor is the least the budget is lowered to. Default Ceiling/10.
	Floor int64
	// Interval is the time between two readings. Default 2s.
	Interval time.Duration
	// Decrease multiplies the budget after a reading with pressure.
	// Default 0.7.
	Decrease float64
	// Increase is added to the budget after a reading without pressure.
	// Default Ceiling/20.
	Increase int64
	// MaxTTFT, when set, makes a mean time to first token above it, over
	// the requests that got their first token since the last reading,
	// pressure too. Default 0: time to first token is not used.
	MaxTTFT time.Duration
	// Client reads the metrics. Default: a client with a 5s timeout.
	Client *http.Client
	// Logger receives each change of the budget and of the lease's holder
	// (Info) and failed readings (Warn). Default slog.Default().
	Logger *slog.Logger

	// DB, when set, makes the observers of one pool take turns through
	// the pool's observer lease (a row, migration 0018), so one may run in
	// every process: only the holder reads the server and applies the
	// control law, the others stand by and one of them takes over when
	// the holder stops or its lease lapses. Pass the pool the Postgres
	// limiter runs on. Nil: this observer always applies, which is right
	// with admission.Local or when a single process runs the pool's only
	// observer.
	DB llmqtype.DBTX
	// Schema holds the lease table (with DB). Default "llmq".
	Schema string
	// Holder names this observer on the lease. Default host/pid/random.
	Holder string
	// Lease is how long the lease holds without a renewal; every reading
	// renews it. Default 3×Interval; at least 2×Interval.
	Lease time.Duration
}

// Observer lowers a pool's in-flight token budget while its server
// queues or preempts, and raises it back slowly when it stops; see the
// package documentation for the control law. Run one per pool.
type Observer struct {
	l   Limiter
	cfg Config
	sql statements // with Config.DB

	holding bool    // whether the last Step held the lease
	last    Reading // the previous successful reading; zero before the first
	hasLast bool
}

// Reading is what one Step read and did.
type Reading struct {
	Waiting, Running float64
	KVUsage          float64 // 0 to 1
	Preemptions      float64 // the counter's value
	TTFTSum          float64 // seconds, the histogram's sum
	TTFTCount        float64
	// Pressure names what made this reading lower the budget: "waiting",
	// "preemptions" or "ttft"; "" when it raised it (or left it at the
	// ceiling).
	Pressure string
	// Budget is the pool's MaxInFlightTokens after this reading.
	Budget int64
	// Standby is true when another observer holds the pool's lease (see
	// Config.DB): this one read nothing and changed nothing.
	Standby bool
}

// statements are lease.sql's; dbsqltest checks them against the schema.
type statements struct {
	takeLease, releaseLease string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{leaseSQL},
		dbsql.Query(&q.takeLease, "TakeLease", 3, new(time.Time)),
		dbsql.Exec(&q.releaseLease, "ReleaseLease", 2),
	)
}

// New validates cfg and returns an observer of l's pool.
func New(l Limiter, cfg Config) (*Observer, error) {
	fail := func(field, format string, args ...any) (*Observer, error) {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	if l == nil {
		return fail("Limiter", "is required")
	}
	if cfg.Pool == "" {
		return fail("Pool", "is required")
	}
	if u, err := url.Parse(cfg.MetricsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fail("MetricsURL", "%q is not an http(s) URL", cfg.MetricsURL)
	}
	if cfg.Ceiling <= 0 {
		return fail("Ceiling", "is %d; the configured budget in tokens must be positive", cfg.Ceiling)
	}
	cfg.Floor = cmp.Or(cfg.Floor, max(1, cfg.Ceiling/10))
	cfg.Interval = cmp.Or(cfg.Interval, 2*time.Second)
	cfg.Decrease = cmp.Or(cfg.Decrease, 0.7)
	cfg.Increase = cmp.Or(cfg.Increase, max(1, cfg.Ceiling/20))
	switch {
	case cfg.Floor < 0 || cfg.Floor > cfg.Ceiling:
		return fail("Floor", "is %d; use 0 for the default or 1 to Ceiling (%d)", cfg.Floor, cfg.Ceiling)
	case cfg.Interval < 0:
		return fail("Interval", "is %v; must be positive", cfg.Interval)
	case !(cfg.Decrease > 0 && cfg.Decrease < 1):
		return fail("Decrease", "is %v; use 0 for the default or a factor in (0, 1)", cfg.Decrease)
	case cfg.Increase < 0:
		return fail("Increase", "is %d; must be positive", cfg.Increase)
	case cfg.MaxTTFT < 0:
		return fail("MaxTTFT", "is %v; must not be negative", cfg.MaxTTFT)
	case cfg.Lease < 0:
		return fail("Lease", "is %v; use 0 for the default or a positive duration", cfg.Lease)
	}
	o := &Observer{l: l}
	if cfg.DB != nil {
		schema, err := dbsql.NewSchema(cfg.Schema)
		if err != nil {
			return fail("Schema", "%v", err)
		}
		cfg.Schema = schema.Name()
		if _, err := o.sql.load(schema); err != nil {
			return nil, fmt.Errorf("kvfeedback: %w", err)
		}
		cfg.Lease = cmp.Or(cfg.Lease, 3*cfg.Interval)
		if cfg.Lease < 2*cfg.Interval {
			return fail("Lease", "is %v; use at least twice Interval (%v), or the holder loses it between readings", cfg.Lease, cfg.Interval)
		}
		if cfg.Holder == "" {
			host, _ := os.Hostname()
			var b [4]byte
			_, _ = rand.Read(b[:])
			cfg.Holder = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
		}
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 5 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	o.cfg = cfg
	return o, nil
}

// Run reads the metrics every Interval and adjusts the budget until ctx
// ends. A reading that fails (the server is down, the page is malformed)
// is logged and leaves the budget where it is. With Config.DB, Run frees
// the pool's lease when it returns.
func (o *Observer) Run(ctx context.Context) error {
	defer o.release(context.WithoutCancel(ctx))
	for {
		if _, err := o.Step(ctx); err != nil && ctx.Err() == nil {
			o.cfg.Logger.WarnContext(ctx, "kvfeedback: reading the server's metrics failed; the budget stays", "pool", o.cfg.Pool, "err", err)
		}
		if !retry.Sleep(ctx, o.cfg.Interval) {
			return nil
		}
	}
}

// Step takes one reading and applies the control law once. With
// Config.DB it first takes or renews the pool's lease, and while another
// observer holds it returns a Reading with Standby set.
func (o *Observer) Step(ctx context.Context) (Reading, error) {
	if o.cfg.DB != nil {
		held, err := o.takeLease(ctx)
		if err != nil {
			return Reading{}, err
		}
		if !held {
			return Reading{Standby: true}, nil
		}
	}
	r, err := o.read(ctx)
	if err != nil {
		return Reading{}, err
	}
	state, err := o.l.State(ctx, o.cfg.Pool)
	if err != nil {
		return Reading{}, fmt.Errorf("kvfeedback: reading pool %q: %w", o.cfg.Pool, err)
	}
	budget := state.MaxInFlightTokens
	if budget <= 0 || budget > o.cfg.Ceiling {
		budget = o.cfg.Ceiling
	}
	r.Pressure = o.pressure(r)
	if r.Pressure != "" {
		budget = max(o.cfg.Floor, int64(math.Floor(float64(budget)*o.cfg.Decrease)))
	} else {
		budget = min(o.cfg.Ceiling, budget+o.cfg.Increase)
	}
	r.Budget = budget
	o.last, o.hasLast = r, true
	if budget == state.MaxInFlightTokens {
		return r, nil
	}
	p := state.Pool
	p.MaxInFlightTokens = budget
	if err := o.l.SetPool(ctx, p); err != nil {
		return r, fmt.Errorf("kvfeedback: setting pool %q's budget to %d: %w", o.cfg.Pool, budget, err)
	}
	o.cfg.Logger.InfoContext(ctx, "kvfeedback: in-flight token budget changed", "pool", o.cfg.Pool,
		"from", state.MaxInFlightTokens, "to", budget, "pressure", r.Pressure,
		"waiting", r.Waiting, "running", r.Running, "kv_cache_usage", r.KVUsage)
	return r, nil
}

// pressure says what in r, against the previous reading, shows the server
// queueing or preempting. A counter that went down (the server restarted)
// starts a new baseline.
func (o *Observer) pressure(r Reading) string {
	switch {
	case r.Waiting > 0:
		return "waiting"
	case !o.hasLast:
		return ""
	case r.Preemptions > o.last.Preemptions:
		return "preemptions"
	}
	if o.cfg.MaxTTFT > 0 {
		n := r.TTFTCount - o.last.TTFTCount
		if n > 0 && r.TTFTSum >= o.last.TTFTSum && (r.TTFTSum-o.last.TTFTSum)/n > o.cfg.MaxTTFT.Seconds() {
			return "ttft"
		}
	}
	return ""
}

func (o *Observer) read(ctx context.Context) (Reading, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.cfg.MetricsURL, http.NoBody)
	if err != nil {
		return Reading{}, fmt.Errorf("kvfeedback: %w", err)
	}
	resp, err := o.cfg.Client.Do(req)
	if err != nil {
		return Reading{}, fmt.Errorf("kvfeedback: reading %s: %w", o.cfg.MetricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Reading{}, fmt.Errorf("kvfeedback: reading %s: %s", o.cfg.MetricsURL, resp.Status)
	}
	m, err := ParseMetrics(resp.Body, o.cfg.Model)
	if err != nil {
		return Reading{}, fmt.Errorf("kvfeedback: reading %s: %w", o.cfg.MetricsURL, err)
	}
	if _, ok := m[MetricWaiting]; !ok {
		return Reading{}, fmt.Errorf("kvfeedback: reading %s: %w: no %s", o.cfg.MetricsURL, ErrMalformed, MetricWaiting)
	}
	usage, ok := m[MetricKVUsage]
	if !ok {
		usage = m[MetricGPUUsage]
	}
	return Reading{
		Waiting: m[MetricWaiting], Running: m[MetricRunning], KVUsage: usage, Preemptions: m[MetricPreemptions],
		TTFTSum: m[MetricTTFTSum], TTFTCount: m[MetricTTFTCount],
	}, nil
}

// takeLease takes or renews the pool's lease and reports whether this
// observer holds it. A reading taken before another held the lease is
// no baseline for the counters: the server may have preempted many times
// since, so preemptions and time to first token start again.
func (o *Observer) takeLease(ctx context.Context) (bool, error) {
	var until time.Time
	err := o.cfg.DB.QueryRow(ctx, o.sql.takeLease, o.cfg.Pool, o.cfg.Holder, o.cfg.Lease.Milliseconds()).Scan(&until)
	held := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("kvfeedback: taking pool %q's observer lease: %w", o.cfg.Pool, dbsql.Explain(err, o.cfg.Schema, "kvfeedback.Config.Schema"))
	}
	if held != o.holding {
		o.holding = held
		if held {
			o.cfg.Logger.InfoContext(ctx, "kvfeedback: this observer holds the pool's lease and adjusts its budget", "pool", o.cfg.Pool, "holder", o.cfg.Holder)
		} else {
			o.cfg.Logger.InfoContext(ctx, "kvfeedback: another observer holds the pool's lease; standing by", "pool", o.cfg.Pool, "holder", o.cfg.Holder)
		}
	}
	if !held {
		o.hasLast = false
	}
	return held, nil
}

// release frees the pool's lease if this observer holds it, so another
// takes over at its next reading.
func (o *Observer) release(ctx context.Context) {
	if o.cfg.DB == nil || !o.holding {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := o.cfg.DB.Exec(ctx, o.sql.releaseLease, o.cfg.Pool, o.cfg.Holder); err != nil {
		o.cfg.Logger.WarnContext(ctx, "kvfeedback: freeing the pool's observer lease failed; another observer takes over when it lapses",
			"pool", o.cfg.Pool, "lease", o.cfg.Lease, "err", err)
		return
	}
	o.holding = false
}
