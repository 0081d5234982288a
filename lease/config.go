package lease

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// Defaults for a zero Config.
const (
	DefaultQueue             = jobs.DefaultQueue
	DefaultMaxWorkers        = 10
	DefaultClaimBatch        = 10
	DefaultLeaseDuration     = 90 * time.Second
	DefaultAttemptTimeout    = 45 * time.Second
	DefaultPollInterval      = time.Second
	DefaultClaimCooldown     = 2 * time.Millisecond
	DefaultShutdownGrace     = 10 * time.Second
	DefaultInvalidOutputRuns = 2 // attempts that may end in invalid output before the final decision
	DefaultLowPriorityShare  = 0.10
	DefaultHungGrace         = 10 * time.Second // at most LeaseDuration/2
	DefaultUnservedKinds     = time.Minute
)

// ErrInvalidConfig is matched (errors.Is) by every error NewRunner returns
// for a Config it cannot run.
var ErrInvalidConfig = errors.New("lease: invalid config")

// QueueConfig sizes one queue's share of a runner.
type QueueConfig struct {
	// MaxWorkers bounds how many of the queue's jobs this runner runs at
	// once. Default 10.
	MaxWorkers int
	// LowPriorityShare is the fraction of each tenant's claims kept for its
	// least urgent class with eligible work, so that urgent work cannot
	// starve it. Default 0.10; negative means none (strict priority); at
	// most 1.
	LowPriorityShare float64
}

// InvalidOutputPolicy decides what happens to a job whose output is still
// invalid when its invalid-output budget is spent.
type InvalidOutputPolicy int

const (
	// InvalidOutputReview sends the job to REVIEW_REQUIRED with the last
	// output as its result (the default): a person decides.
	InvalidOutputReview InvalidOutputPolicy = iota
	// InvalidOutputFail fails the job (FAILED_TERMINAL, dead-lettered).
	InvalidOutputFail
)

// SucceededHook adds the host's own writes to the transaction that records
// a job's success, such as webhook deliveries. It sees the job as
// committed-to-be (SUCCEEDED, with its result). An error rolls the
// completion back; see Config.OnSucceeded.
type SucceededHook func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error

// Config configures a Runner. Zero values mean the documented defaults;
// NewRunner rejects combinations that cannot work.
type Config struct {
	// Handlers run jobs, by kind. Required. The runner only claims kinds it
	// has a handler for.
	Handlers map[string]Handler
	// Queues to serve and their concurrency. Default: "default" with 10
	// workers. Each queue has its own claim loop and its own slots, so one
	// queue's backlog never delays another's.
	Queues map[string]QueueConfig
	// WorkerID names this runner in leases and attempt rows. Default:
	// host name, process id and a random suffix.
	WorkerID string
	// ClaimBatch is the most jobs one claim takes (never more than the
	// queue's free slots). Default 10.
	ClaimBatch int
	// LeaseDuration is how long a claim lasts without a heartbeat. Default
	// 90s. A worker that stops heartbeating loses its jobs this long after
	// its last heartbeat.
	LeaseDuration time.Duration
	// HeartbeatInterval is how often leases are extended, in one statement
	// for all of them. Default a third of LeaseDuration; must be shorter
	// than LeaseDuration.
	HeartbeatInterval time.Duration
	// AttemptTimeout bounds one attempt; the handler's context is cancelled
	// when it fires. Default 45s; must be shorter than LeaseDuration.
	AttemptTimeout time.Duration
	// HungGrace is how long a handler may keep running after its context
	// was cancelled at AttemptTimeout. An attempt still running then is
	// hung: the runner stops renewing its lease and records the attempt as
	// hung and uncertain (jobs.RunnerStore.MarkHung); once the lease has expired
	// any runner's reaper takes the job back and it is retried under a new
	// fence, and whatever the hung handler returns later is recorded as
	// stale. The hung handler's goroutine keeps its worker slot until it
	// returns. Default 10s, or LeaseDuration/2 if that is shorter.
	HungGrace time.Duration
	// PollInterval is the fallback claim interval when no NOTIFY arrives.
	// Default 1s.
	PollInterval time.Duration
	// ClaimCooldown is the least time between two claims of one queue, so
	// that under a stream of NOTIFYs jobs are claimed in batches instead of
	// one claim (and one commit) each. A claim after a quiet spell is never
	// delayed. Default 2ms.
	ClaimCooldown time.Duration
	// ReapInterval is how often this runner takes back expired leases and
	// fails jobs past their deadline. Default a sixth of LeaseDuration.
	ReapInterval time.Duration
	// UnservedKinds is how often the runner looks, in each of its queues,
	// for jobs of kinds it has no handler for that have been runnable at
	// least that long, and warns about them (jobs.PostgresStore.
	// UnservedKinds says what it reads). Default 1 minute; negative turns
	// the check off.
	UnservedKinds time.Duration
	// ShutdownGrace is how long in-flight attempts may finish after Run's
	// context is cancelled, before their contexts are cancelled too and
	// their jobs released. Default 10s.
	ShutdownGrace time.Duration
	// Retry is the default backoff; RetryByKind overrides it per kind.
	// Defaults: base 2s, cap 60s.
	Retry       llmqtype.BackoffPolicy
	RetryByKind map[string]llmqtype.BackoffPolicy
	// DeadlineMargin is the time reserved for a retry's attempt: a retry
	// that would start later than the deadline minus this margin is refused
	// and the job fails with class "deadline". Default AttemptTimeout.
	DeadlineMargin time.Duration
	// InvalidOutputAttempts is how many attempts may end in invalid output
	// before InvalidOutput decides. Default 2 (one retry).
	InvalidOutputAttempts int
	// InvalidOutput is the decision once that budget is spent. Default
	// InvalidOutputReview.
	InvalidOutput InvalidOutputPolicy
	// OnSucceeded, when set, runs in the transaction that records each
	// success, with a context in the job's trace (the span that accepted
	// it), so that jobs it enqueues and events it writes join that trace.
	// If it fails, the completion is retried a few times and then recorded
	// as a transient failure (the job is retried) without the hook; a
	// failure that is the database's (a lost connection) is not counted,
	// and the completion is tried again with the hook. Keep
	// it to database writes: the transaction holds the jobs' rows, and
	// Postgres ends it if it sits idle for a third of LeaseDuration.
	OnSucceeded SucceededHook
	// AfterRecord, when set, is called once each attempt's outcome is
	// durable (or recording it failed for good), outside any transaction:
	// with the job as recorded, or with the error (jobs.ErrLeaseLost for a
	// stale attempt). For metrics and tests; it must not block.
	AfterRecord func(job *jobs.Job, err error)
	// DisableListen stops the runner from LISTENing for the store's enqueue
	// NOTIFY, for hosts whose job signals arrive through a broker and call
	// Runner.Wake instead. Polling (PollInterval) still runs, so work is
	// found without any signal at all. Default false: listen.
	DisableListen bool
	// Logger receives the runner's operational messages. Default: warnings
	// and errors go to slog.Default() (as it is when each line is written),
	// lower levels nowhere; slog.New(slog.DiscardHandler) silences the
	// runner. Lines about one attempt carry job, tenant, kind, attempt and
	// fence; handlers get the same logger from their context with
	// Logger(ctx).
	Logger *slog.Logger
	// MeterProvider receives the runner's metrics, and the store's queue
	// gauges while Run runs (when the store is a *jobs.PostgresStore); see
	// the package documentation. Nil means none: no global provider is
	// used.
	MeterProvider metric.MeterProvider
	// GaugeRefresh is the longest the queue gauges reuse one reading of
	// the database. Default jobs.DefaultGaugeRefresh (15s).
	GaugeRefresh time.Duration
	// NoQueueGauges leaves the queue gauges to another process: every
	// runner with a MeterProvider reads them once per GaugeRefresh, which a
	// fleet of many runners on a large backlog may not want (see
	// jobs.PostgresStore.Depth for the cost).
	NoQueueGauges bool
	// TracerProvider receives a span per attempt, continuing the trace of
	// the request that accepted the job. Nil means none.
	TracerProvider trace.TracerProvider
	// Admission, when set, runs provider calls under an admission limiter:
	// claims wait for the queue's pools, attempts hold permits, and 429s
	// cool pools down without spending retries. See Admission.
	Admission *Admission

	obs *instruments // built once by withDefaults
}

// withDefaults validates c and fills in every default.
func (c Config) withDefaults() (Config, error) {
	fail := func(format string, args ...any) (Config, error) {
		return c, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if len(c.Handlers) == 0 {
		return fail("Handlers is empty; register a handler for each kind this runner runs")
	}
	for kind, h := range c.Handlers {
		if h == nil {
			return fail("Handlers[%q] is nil", kind)
		}
	}
	if len(c.Queues) == 0 {
		c.Queues = map[string]QueueConfig{DefaultQueue: {}}
	}
	queues := make(map[string]QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		if q.MaxWorkers < 0 {
			return fail("Queues[%q].MaxWorkers is %d; use 0 for the default or a positive number", name, q.MaxWorkers)
		}
		q.MaxWorkers = cmp.Or(q.MaxWorkers, DefaultMaxWorkers)
		switch {
		case q.LowPriorityShare > 1:
			return fail("Queues[%q].LowPriorityShare is %g; use 0 for the default, a fraction up to 1, or a negative number for none", name, q.LowPriorityShare)
		case q.LowPriorityShare == 0:
			q.LowPriorityShare = DefaultLowPriorityShare
		case q.LowPriorityShare < 0:
			q.LowPriorityShare = 0
		}
		queues[name] = q
	}
	c.Queues = queues
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"LeaseDuration", c.LeaseDuration}, {"HeartbeatInterval", c.HeartbeatInterval},
		{"AttemptTimeout", c.AttemptTimeout}, {"PollInterval", c.PollInterval}, {"ClaimCooldown", c.ClaimCooldown},
		{"ReapInterval", c.ReapInterval}, {"ShutdownGrace", c.ShutdownGrace},
		{"DeadlineMargin", c.DeadlineMargin}, {"GaugeRefresh", c.GaugeRefresh}, {"HungGrace", c.HungGrace},
	} {
		if d.v < 0 {
			return fail("%s is %s; use 0 for the default or a positive duration", d.name, d.v)
		}
	}
	if c.ClaimBatch < 0 || c.ClaimBatch > jobs.MaxBatch {
		return fail("ClaimBatch is %d; use 0 for the default or 1 to %d", c.ClaimBatch, jobs.MaxBatch)
	}
	if c.InvalidOutputAttempts < 0 {
		return fail("InvalidOutputAttempts is %d; use 0 for the default or a positive number", c.InvalidOutputAttempts)
	}
	c.ClaimBatch = cmp.Or(c.ClaimBatch, DefaultClaimBatch)
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, c.LeaseDuration/3)
	c.AttemptTimeout = cmp.Or(c.AttemptTimeout, min(DefaultAttemptTimeout, c.LeaseDuration/2))
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.ClaimCooldown = cmp.Or(c.ClaimCooldown, DefaultClaimCooldown)
	c.ReapInterval = cmp.Or(c.ReapInterval, c.LeaseDuration/6)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, DefaultShutdownGrace)
	c.HungGrace = cmp.Or(c.HungGrace, min(DefaultHungGrace, c.LeaseDuration/2))
	c.UnservedKinds = cmp.Or(c.UnservedKinds, DefaultUnservedKinds)
	c.DeadlineMargin = cmp.Or(c.DeadlineMargin, c.AttemptTimeout)
	c.InvalidOutputAttempts = cmp.Or(c.InvalidOutputAttempts, DefaultInvalidOutputRuns)
	switch {
	case c.LeaseDuration < time.Second:
		return fail("LeaseDuration is %s; use at least 1s", c.LeaseDuration)
	case c.HeartbeatInterval >= c.LeaseDuration:
		return fail("HeartbeatInterval (%s) must be shorter than LeaseDuration (%s)", c.HeartbeatInterval, c.LeaseDuration)
	case c.AttemptTimeout >= c.LeaseDuration:
		return fail("AttemptTimeout (%s) must be shorter than LeaseDuration (%s): an attempt must end before its lease can", c.AttemptTimeout, c.LeaseDuration)
	case c.InvalidOutput != InvalidOutputReview && c.InvalidOutput != InvalidOutputFail:
		return fail("InvalidOutput is %d; use InvalidOutputReview or InvalidOutputFail", c.InvalidOutput)
	}
	if err := c.Retry.Validate(); err != nil {
		return fail("Retry: %v", err)
	}
	c.Retry = c.Retry.WithDefaults()
	for kind, p := range c.RetryByKind {
		if err := p.Validate(); err != nil {
			return fail("RetryByKind[%q]: %v", kind, err)
		}
	}
	obs, err := newInstruments(c)
	if err != nil {
		return fail("instruments: %v", err)
	}
	c.obs = obs
	if c.Admission != nil {
		a, err := c.Admission.withDefaults(c.AttemptTimeout)
		if err != nil {
			return fail("%v", err)
		}
		a.obs = obs
		for kind := range a.Routes {
			if _, ok := c.Handlers[kind]; !ok {
				return fail("Admission.Routes[%q]: no handler of that kind", kind)
			}
		}
		c.Admission, c.Handlers = a, a.wrap(c.Handlers)
	}
	if c.WorkerID == "" {
		c.WorkerID = defaultWorkerID()
	}
	if c.Logger == nil {
		c.Logger = slog.New(defaultWarnings{source: slog.Default})
	}
	return c, nil
}

func (c Config) retryPolicy(kind string) llmqtype.BackoffPolicy {
	if p, ok := c.RetryByKind[kind]; ok {
		return p.WithDefaults()
	}
	return c.Retry
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	var b [3]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// defaultWarnings is the runner's logger when Config.Logger is nil: it
// passes warnings and errors to slog.Default(), read when each line is
// written so that a host that sets its default later is still heard, and
// drops lower levels. A defect in a handler, a hung attempt or jobs nobody
// serves must not go unseen because no logger was configured.
type defaultWarnings struct {
	source func() *slog.Logger               // slog.Default
	ops    []func(slog.Handler) slog.Handler // attributes and groups, in order
}

func (h defaultWarnings) target() slog.Handler {
	t := h.source().Handler()
	for _, op := range h.ops {
		t = op(t)
	}
	return t
}

func (h defaultWarnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.source().Handler().Enabled(ctx, l)
}

func (h defaultWarnings) Handle(ctx context.Context, r slog.Record) error {
	return h.target().Handle(ctx, r)
}

func (h defaultWarnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return defaultWarnings{source: h.source, ops: append(slices.Clip(h.ops), func(t slog.Handler) slog.Handler { return t.WithAttrs(attrs) })}
}

func (h defaultWarnings) WithGroup(name string) slog.Handler {
	return defaultWarnings{source: h.source, ops: append(slices.Clip(h.ops), func(t slog.Handler) slog.Handler { return t.WithGroup(name) })}
}
