// Package drill runs the invoice worker's primary-outage drill, which checks
// that extractions keep flowing through the fallback model while the primary
// one is rate-limited or down, and go back to the primary once it heals.
// Command ../cmd/invoice runs it (-drill primary-outage); the package's
// tests run it scaled down.
//
// One fake provider (package fakeprovider) serves the worker's primary model
// in OpenAI's dialect and its fallback (invoice.WorkerConfig.Fallback) in
// Anthropic's, each with a quota of its own; a feeder keeps a backlog of
// extractions in the queue through the service's API; after a warm-up the
// primary model is stormed (429 with Retry-After, fakeprovider.StormModel)
// or out (503, OutageModel) for a while, then heals. The figures are read
// from the database (the attempts' candidates, moves and times) and from
// the fake provider's call log, and checked against four targets (Targets).
package drill

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/examples/internal/sample"
	"github.com/llmq/llmq/examples/invoice"
)

// Faults the drill can put on the primary model.
const (
	// FaultStorm answers the primary model's calls 429 with a Retry-After
	// of what is left of the storm (fakeprovider.StormModel): the first
	// 429 cools the primary pool down for every worker, so attempts pass
	// it over without a call until it ends.
	FaultStorm = "storm"
	// FaultOutage answers them 503 without Retry-After
	// (fakeprovider.OutageModel): every attempt calls the primary, fails
	// and moves to the fallback inside the same attempt.
	FaultOutage = "outage"
	// FaultNone leaves the primary healthy: every attempt should be
	// served by it, and the fallback never called.
	FaultNone = "none"
)

// The models and pools of the drill.
const (
	PrimaryModel   = invoice.Model
	FallbackModel  = "extract-fallback"
	PrimaryPool    = "drill-primary"
	FallbackPool   = "drill-fallback"
	tenant         = "drill"
	token          = "tok-drill"
	cooldownPeriod = time.Second
)

// Config configures a drill. Zero fields take the defaults given.
type Config struct {
	// Pool and Schema are the database; the schema must be migrated
	// (llmq.Migrate). The drill migrates the service's tables and leaves
	// its jobs behind.
	Pool   *pgxpool.Pool
	Schema string
	// Fault is FaultStorm (default), FaultOutage or FaultNone.
	Fault string
	// Warmup, Fault and After are the phases: healthy, faulted, healed.
	// Defaults 10s, 30s and 15s.
	Warmup, FaultFor, After time.Duration
	// Scale divides the fake provider's 15s mean latency. Default 50
	// (300ms).
	Scale float64
	// PrimaryRPM and FallbackRPM are both the fake provider's quotas of
	// the two models and the admission pools' RPM. Defaults 3000 and 600.
	PrimaryRPM, FallbackRPM int
	// Workers is the worker's concurrency. Default 8: with the default
	// latency it can do more than the fallback's quota and less than the
	// primary's, so the fallback is saturated during the fault and the
	// primary never is.
	Workers int
	// Backlog is how many jobs the feeder keeps waiting. Default
	// 4 × Workers.
	Backlog int
	// MaxWait is the worker's Admission.MaxWait (WorkerConfig.MaxWait):
	// how long an attempt waits for a candidate's permit before passing
	// it over. Default lease's (1s). In the last MaxWait of the primary's
	// cooldown, attempts wait for the primary rather than take the
	// fallback, so the fallback idles for up to MaxWait at the fault's end.
	MaxWait time.Duration
	// FallbackTarget is the share of the fallback's quota it must serve
	// during the fault (target (a)). Default TargetFallbackRatio; a test
	// run among other suites sets it lower, since a starved CPU, not
	// routing, then bounds the rate.
	FallbackTarget float64
	Logger         *slog.Logger
}

func (c Config) withDefaults() Config {
	c.Fault = cmp.Or(c.Fault, FaultStorm)
	c.Warmup = cmp.Or(c.Warmup, 10*time.Second)
	c.FaultFor = cmp.Or(c.FaultFor, 30*time.Second)
	c.After = cmp.Or(c.After, 15*time.Second)
	c.Scale = cmp.Or(c.Scale, 50)
	c.PrimaryRPM = cmp.Or(c.PrimaryRPM, 3000)
	c.FallbackRPM = cmp.Or(c.FallbackRPM, 600)
	c.Workers = cmp.Or(c.Workers, 8)
	c.Backlog = cmp.Or(c.Backlog, 4*c.Workers)
	c.FallbackTarget = cmp.Or(c.FallbackTarget, TargetFallbackRatio)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Figures are what a drill measured.
type Figures struct {
	Config Config
	// FaultStart and FaultEnd bound the fault; Healed is FaultEnd.
	FaultStart, FaultEnd, FeedEnd time.Time

	Jobs, Succeeded, Review, Failed int
	// (a) fallback throughput during the fault, from its second second
	// (the first spends the pool's full request bucket, RPM/60 at once):
	// successful attempts served by the fallback that ended in the
	// window, per second, and that over the fallback's quota (RPM/60).
	FallbackServed  int
	FallbackWindow  time.Duration
	FallbackPerSec  float64
	FallbackQuota   float64
	FallbackRatio   float64
	FallbackLogRate float64 // the same from the provider's log: answered calls to the fallback model
	// (b) after the primary healed: attempts that made a call and started
	// from two cooldown periods (2 × 1 s) after the fault's end until the
	// feeder stopped, and the share of them served by the primary.
	RecoveryAttempts int
	RecoveryPrimary  int
	RecoveryShare    float64
	// (c) jobs that failed for their deadline, and of those, the ones
	// whose attempts moved or were snoozed (routing's part).
	MissedDeadline, MissedRouted int
	// (d) calls in the provider's log, and as the attempts recorded them:
	// serving calls (an attempt's candidate) plus moves; Bound is
	// attempts that called × candidates (2).
	LogCalls        int
	LogCallsByModel map[string]int
	ServingCalls    int
	Moves           int
	MovesByFailure  map[string]int
	RecordedByModel map[string]int
	CallAttempts    int
	Bound           int
	Snoozed         int
	// FallbackCalls is the calls to the fallback model in the log.
	FallbackCalls int
	// ServedBy counts successful attempts by candidate.
	ServedBy map[string]int
}

// Targets of the drill.
const (
	TargetFallbackRatio = 0.9
	TargetRecoveryShare = 0.9
)

// Misses names each target the figures missed; none when the drill passed.
func (f *Figures) Misses() []string {
	var m []string
	if f.Config.Fault != FaultNone && f.FallbackRatio < f.Config.FallbackTarget {
		m = append(m, fmt.Sprintf("(a) the fallback served %.2f jobs/s during the fault, %.2f of its quota; target ≥ %.2f", f.FallbackPerSec, f.FallbackRatio, f.Config.FallbackTarget))
	}
	if f.RecoveryShare < TargetRecoveryShare {
		m = append(m, fmt.Sprintf("(b) the primary served %.1f %% of the attempts after it healed; target ≥ %.0f %%", 100*f.RecoveryShare, 100*TargetRecoveryShare))
	}
	if f.MissedDeadline > 0 {
		m = append(m, fmt.Sprintf("(c) %d jobs missed their deadline (%d after moves or snoozes); target 0", f.MissedDeadline, f.MissedRouted))
	}
	if f.LogCalls > f.Bound {
		m = append(m, fmt.Sprintf("(d) %d provider calls for %d attempts × 2 candidates = %d; target ≤", f.LogCalls, f.CallAttempts, f.Bound))
	}
	if f.LogCalls != f.ServingCalls+f.Moves {
		m = append(m, fmt.Sprintf("(d) %d provider calls but %d recorded (%d serving + %d moves): every call must be recorded", f.LogCalls, f.ServingCalls+f.Moves, f.ServingCalls, f.Moves))
	}
	for model, n := range f.LogCallsByModel {
		if f.RecordedByModel[model] != n {
			m = append(m, fmt.Sprintf("(d) model %s: %d calls in the provider's log, %d recorded", model, n, f.RecordedByModel[model]))
		}
	}
	if f.Jobs == 0 || f.Succeeded+f.Review+f.Failed != f.Jobs {
		m = append(m, fmt.Sprintf("%d jobs, %d finished", f.Jobs, f.Succeeded+f.Review+f.Failed))
	}
	return m
}

// String is the drill's report.
func (f *Figures) String() string {
	var b strings.Builder
	c := f.Config
	fmt.Fprintf(&b, "primary-outage drill: fault %s on %s for %s after %s warm-up, %s after; %d workers; quotas %s %d RPM, %s %d RPM; mean latency %s\n",
		c.Fault, PrimaryModel, c.FaultFor, c.Warmup, c.After, c.Workers, PrimaryModel, c.PrimaryRPM, FallbackModel, c.FallbackRPM,
		time.Duration(float64(15*time.Second)/c.Scale).Round(time.Millisecond))
	fmt.Fprintf(&b, "jobs %d: %d succeeded, %d review, %d failed; successful attempts by candidate: primary %d, fallback %d\n",
		f.Jobs, f.Succeeded, f.Review, f.Failed, f.ServedBy[invoice.PrimaryCandidate], f.ServedBy[invoice.FallbackCandidate])
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "MISSED"
	}
	if c.Fault != FaultNone {
		fmt.Fprintf(&b, "(a) fallback during the fault: %d jobs in %s = %.2f/s against its quota %.2f/s (RPM/60): %.2f (target ≥ %.2f) %s; provider log: %.2f answered/s\n",
			f.FallbackServed, f.FallbackWindow.Round(time.Millisecond), f.FallbackPerSec, f.FallbackQuota, f.FallbackRatio, TargetFallbackRatio,
			mark(f.FallbackRatio >= TargetFallbackRatio), f.FallbackLogRate)
	}
	fmt.Fprintf(&b, "(b) after the primary healed (attempts started ≥ 2 × %s after): %d of %d served by the primary = %.1f %% (target ≥ %.0f %%) %s\n",
		cooldownPeriod, f.RecoveryPrimary, f.RecoveryAttempts, 100*f.RecoveryShare, 100*TargetRecoveryShare, mark(f.RecoveryShare >= TargetRecoveryShare))
	fmt.Fprintf(&b, "(c) missed deadlines: %d, %d of them after moves or snoozes (target 0) %s\n", f.MissedDeadline, f.MissedRouted, mark(f.MissedDeadline == 0))
	fmt.Fprintf(&b, "(d) provider calls %d (%s); recorded %d = %d serving + %d moves (%s); snoozed attempts %d; bound %d attempts × 2 candidates = %d: %s\n",
		f.LogCalls, byKey(f.LogCallsByModel), f.ServingCalls+f.Moves, f.ServingCalls, f.Moves, byKey(f.MovesByFailure), f.Snoozed,
		f.CallAttempts, f.Bound, mark(f.LogCalls <= f.Bound && f.LogCalls == f.ServingCalls+f.Moves))
	return b.String()
}

func byKey(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// Run runs a drill and returns its figures; check them with Misses.
func Run(ctx context.Context, cfg Config) (*Figures, error) {
	cfg = cfg.withDefaults()
	switch cfg.Fault {
	case FaultStorm, FaultOutage, FaultNone:
	default:
		return nil, fmt.Errorf("drill: unknown fault %q: %s, %s or %s", cfg.Fault, FaultStorm, FaultOutage, FaultNone)
	}
	svc, err := invoice.New(cfg.Pool, invoice.Config{
		Schema: cfg.Schema, Auth: invoice.NewAuth(map[string]invoice.Credential{token: {Tenant: tenant}}),
		AllowLoopback: true, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	if err := svc.Migrate(ctx); err != nil {
		return nil, err
	}
	supplier := invoice.Supplier{Name: "Nordwind Papier GmbH", IBAN: "DE89370400440532013000"}
	if err := svc.PutSupplier(ctx, tenant, supplier); err != nil {
		return nil, err
	}

	var mu sync.Mutex
	var calls []fakeprovider.Call
	const tpm = 100_000_000
	fake := fakeprovider.New(fakeprovider.Config{
		Scale: cfg.Scale, RPM: 1_000_000, TPM: tpm, Seed: 7,
		Models: map[string]fakeprovider.ModelConfig{
			PrimaryModel:  {RPM: cfg.PrimaryRPM, TPM: tpm},
			FallbackModel: {RPM: cfg.FallbackRPM, TPM: tpm},
		},
		OnCall: func(c fakeprovider.Call) {
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		},
	})
	provider := httptest.NewServer(fake)
	defer provider.Close() // again, for the early returns; Close is idempotent

	runner, err := svc.NewRunner(ctx, invoice.WorkerConfig{
		ProviderURL: provider.URL + "/v1", APIKey: "drill", Pool: PrimaryPool,
		Limits: admission.Pool{RPM: cfg.PrimaryRPM, TPM: tpm, MaxInFlight: cfg.Workers},
		Fallback: &invoice.Fallback{
			ProviderURL: provider.URL, APIKey: "drill", Pool: FallbackPool, Model: FallbackModel,
			Limits: admission.Pool{RPM: cfg.FallbackRPM, TPM: tpm, MaxInFlight: cfg.Workers},
		},
		Workers: cfg.Workers, AttemptTimeout: 15 * time.Second, PollInterval: 100 * time.Millisecond,
		WorkerID: "drill", Logger: cfg.Logger, ShutdownGrace: 5 * time.Second, MaxWait: cfg.MaxWait,
	})
	if err != nil {
		return nil, err
	}
	runCtx, stopRunner := context.WithCancel(ctx)
	worker := start(func() error { return runner.Run(runCtx) })
	defer func() { // an early return still stops the worker before returning
		stopRunner()
		<-worker.done
	}()

	f := &Figures{Config: cfg}
	api := svc.Handler()
	feedCtx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	// A job's deadline leaves it the whole fault and a margin: a job
	// routing let wait out the fault would still make it.
	deadline := max(time.Minute+5*time.Second, cfg.FaultFor+30*time.Second)
	feeder := start(func() error { return feed(feedCtx, svc, api, supplier, cfg, deadline) })
	defer func() {
		stopFeed()
		<-feeder.done
	}()

	phase := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-feeder.done:
			return fmt.Errorf("drill: feeding the backlog: %w", feeder.err)
		case <-worker.done:
			return fmt.Errorf("drill: the worker stopped: %w", worker.err)
		case <-t.C:
			return nil
		}
	}
	if err := phase(cfg.Warmup); err != nil {
		return nil, err
	}
	f.FaultStart = time.Now()
	switch cfg.Fault {
	case FaultStorm:
		fake.StormModel(PrimaryModel, cfg.FaultFor)
	case FaultOutage:
		fake.OutageModel(PrimaryModel, cfg.FaultFor)
	}
	cfg.Logger.Info("drill: fault on", "fault", cfg.Fault, "model", PrimaryModel, "for", cfg.FaultFor)
	if err := phase(cfg.FaultFor); err != nil {
		return nil, err
	}
	fake.Heal(PrimaryModel)
	f.FaultEnd = time.Now()
	cfg.Logger.Info("drill: healed", "model", PrimaryModel)
	if err := phase(cfg.After); err != nil {
		return nil, err
	}
	stopFeed()
	if err := feeder.wait(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("drill: feeding the backlog: %w", err)
	}
	f.FeedEnd = time.Now()
	// The backlog drains; every job ends (the deadline bounds the wait).
	if err := drain(ctx, cfg, worker, deadline); err != nil {
		return nil, err
	}
	stopRunner()
	if err := worker.wait(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("drill: the worker: %w", err)
	}
	// Close waits for the provider's handlers: every call is in the log.
	provider.Close()
	mu.Lock()
	log := calls
	mu.Unlock()
	if err := f.measure(ctx, cfg, log); err != nil {
		return nil, err
	}
	return f, nil
}

// task is a goroutine's run and its error.
type task struct {
	done chan struct{}
	err  error
}

func start(fn func() error) *task {
	t := &task{done: make(chan struct{})}
	go func() {
		defer close(t.done)
		t.err = fn()
	}()
	return t
}

func (t *task) wait() error {
	<-t.done
	return t.err
}

// feed keeps cfg.Backlog jobs waiting in the queue until ctx ends,
// accepting each through the service's API: a new document (unique
// bytes, so no result is reused) and an extraction of it needed by
// deadline from now.
func feed(ctx context.Context, svc *invoice.Service, api http.Handler, sup invoice.Supplier, cfg Config, deadline time.Duration) error {
	n := 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		err := cfg.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{cfg.Schema, "jobs"}.Sanitize()+
			` WHERE kind = $1 AND state IN ('READY', 'RETRY_SCHEDULED')`, invoice.Kind).Scan(&waiting)
		if err != nil {
			return err
		}
		for ; waiting < cfg.Backlog && ctx.Err() == nil; waiting++ {
			n++
			// An acceptance in flight finishes when the feeder stops.
			if err := accept(context.WithoutCancel(ctx), svc, api, sup, n, deadline); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func accept(ctx context.Context, svc *invoice.Service, api http.Handler, sup invoice.Supplier, n int, deadline time.Duration) error {
	number := fmt.Sprintf("DR-%06d", n)
	doc, err := svc.PutDocument(ctx, tenant, number+".txt", sample.Invoice(sup, number, n, ""))
	if err != nil {
		return err
	}
	body, err := json.Marshal(invoice.CreateRequest{Document: doc, Schema: invoice.SchemaV1, NeededBy: time.Now().Add(deadline)})
	if err != nil {
		return err
	}
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/extraction-jobs", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", number)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted {
		return fmt.Errorf("POST /extraction-jobs: %d %s", rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return nil
}

// drain waits until every extraction has ended.
func drain(ctx context.Context, cfg Config, worker *task, deadline time.Duration) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(deadline + time.Minute)
	defer limit.Stop()
	for {
		var open int
		err := cfg.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{cfg.Schema, "jobs"}.Sanitize()+
			` WHERE kind = $1 AND state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')`, invoice.Kind).Scan(&open)
		if err != nil {
			return err
		}
		if open == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-worker.done:
			return fmt.Errorf("drill: the worker stopped: %w", worker.err)
		case <-limit.C:
			return fmt.Errorf("drill: %d extractions still open after the drill", open)
		case <-tick.C:
		}
	}
}

// measure reads the figures from the database and the provider's log.
func (f *Figures) measure(ctx context.Context, cfg Config, log []fakeprovider.Call) error {
	jobsT := pgx.Identifier{cfg.Schema, "jobs"}.Sanitize()
	attemptsT := pgx.Identifier{cfg.Schema, "job_attempts"}.Sanitize()
	db := cfg.Pool
	if err := db.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE state = 'SUCCEEDED'),
			count(*) FILTER (WHERE state = 'REVIEW_REQUIRED'),
			count(*) FILTER (WHERE state IN ('FAILED_TERMINAL', 'CANCELLED')),
			count(*) FILTER (WHERE state = 'FAILED_TERMINAL' AND (error_class = 'deadline' OR finished_at > deadline_at)),
			count(*) FILTER (WHERE state = 'FAILED_TERMINAL' AND (error_class = 'deadline' OR finished_at > deadline_at)
				AND EXISTS (SELECT 1 FROM `+attemptsT+` a WHERE a.job_id = j.id AND (a.moves IS NOT NULL OR a.outcome = 'snoozed')))
		FROM `+jobsT+` j WHERE kind = $1`, invoice.Kind).
		Scan(&f.Jobs, &f.Succeeded, &f.Review, &f.Failed, &f.MissedDeadline, &f.MissedRouted); err != nil {
		return err
	}

	type attempt struct {
		started, ended time.Time
		outcome        string
		candidate      string
		moves          []struct{ Candidate, Failure string }
	}
	rows, err := db.Query(ctx, `SELECT a.started_at, a.ended_at, a.outcome, coalesce(a.candidate, ''), coalesce(a.moves, '[]')
		FROM `+attemptsT+` a JOIN `+jobsT+` j ON j.id = a.job_id WHERE j.kind = $1`, invoice.Kind)
	if err != nil {
		return err
	}
	attempts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (attempt, error) {
		var a attempt
		var moves []byte
		if err := row.Scan(&a.started, &a.ended, &a.outcome, &a.candidate, &moves); err != nil {
			return a, err
		}
		return a, json.Unmarshal(moves, &a.moves)
	})
	if err != nil {
		return err
	}
	modelOf := map[string]string{invoice.PrimaryCandidate: PrimaryModel, invoice.FallbackCandidate: FallbackModel}
	f.ServedBy, f.MovesByFailure, f.RecordedByModel = map[string]int{}, map[string]int{}, map[string]int{}
	winStart := f.FaultStart.Add(time.Second)
	f.FallbackWindow = f.FaultEnd.Sub(winStart)
	recovery := f.FaultEnd.Add(2 * cooldownPeriod)
	if cfg.Fault == FaultNone {
		recovery = f.FaultStart // the whole run is "healthy"
	}
	for _, a := range attempts {
		if a.outcome == "snoozed" {
			f.Snoozed++
		}
		if a.candidate != "" {
			f.ServingCalls++
			f.RecordedByModel[modelOf[a.candidate]]++
		}
		for _, m := range a.moves {
			f.Moves++
			f.MovesByFailure[m.Failure]++
			f.RecordedByModel[modelOf[m.Candidate]]++
		}
		if a.candidate != "" || len(a.moves) > 0 {
			f.CallAttempts++
		}
		if a.outcome == "succeeded" {
			f.ServedBy[a.candidate]++
			if a.candidate == invoice.FallbackCandidate && !a.ended.Before(winStart) && !a.ended.After(f.FaultEnd) {
				f.FallbackServed++
			}
		}
		if a.candidate != "" && !a.started.Before(recovery) && a.started.Before(f.FeedEnd) {
			f.RecoveryAttempts++
			if a.candidate == invoice.PrimaryCandidate {
				f.RecoveryPrimary++
			}
		}
	}
	f.Bound = 2 * f.CallAttempts
	f.FallbackQuota = float64(cfg.FallbackRPM) / 60
	if secs := f.FallbackWindow.Seconds(); secs > 0 {
		f.FallbackPerSec = float64(f.FallbackServed) / secs
		f.FallbackRatio = f.FallbackPerSec / f.FallbackQuota
	}
	if f.RecoveryAttempts > 0 {
		f.RecoveryShare = float64(f.RecoveryPrimary) / float64(f.RecoveryAttempts)
	}
	f.LogCallsByModel = map[string]int{}
	answered := 0
	for _, c := range log {
		if c.API != "openai" && c.API != "anthropic" {
			continue
		}
		f.LogCalls++
		f.LogCallsByModel[c.Model]++
		if c.Model == FallbackModel {
			f.FallbackCalls++
			if c.Status == http.StatusOK && !c.End.Before(winStart) && !c.End.After(f.FaultEnd) {
				answered++
			}
		}
	}
	if secs := f.FallbackWindow.Seconds(); secs > 0 {
		f.FallbackLogRate = float64(answered) / secs
	}
	return nil
}
