package providerbatch

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// Sentinels callers branch on.
var (
	// ErrInvalidConfig is matched by every error NewSubmitter returns for
	// a Config that cannot work.
	ErrInvalidConfig = errors.New("providerbatch: invalid config")
	// ErrNotFound is returned by Operator.Cancel for no open submission.
	ErrNotFound = errors.New("providerbatch: not found")
)

// Defaults of Config's zero fields.
const (
	DefaultLeaseDuration   = 30 * time.Second
	DefaultWindow          = 24 * time.Hour
	DefaultGrace           = time.Hour
	DefaultGatherInterval  = time.Minute
	DefaultPollMin         = 10 * time.Second
	DefaultPollMax         = 5 * time.Minute
	DefaultPrepareLease    = 5 * time.Minute
	DefaultMaxCreateErrors = 5
	// lineOverhead is what a request costs in a batch's bytes beyond its
	// body: OpenAI's JSONL envelope (custom_id, method, url) or
	// Anthropic's (custom_id, params), rounded up.
	lineOverhead = 256
)

// Config configures a Submitter. Pool, Queue, Provider and Calls are
// required; every other zero value means the documented default.
type Config struct {
	// Pool names the provider pool: one submitter is active per pool
	// across every process, under a fenced lease. Usually the admission
	// pool of the same provider account.
	Pool string
	// Queue is the queue whose jobs wait for a batch. Jobs enqueued to it
	// are served by this pool's submitter only; no lease.Runner should
	// serve it. It must be one of the store's Config.Queues.
	Queue string
	// SyncQueue, when set, is where a job goes whose deadline no longer
	// leaves room for a batch (it is sooner than Window when the job is
	// gathered: it was enqueued too late, or an expired or cancelled batch
	// returned it): moved there (jobs.RunnerStore.Move), its attempt
	// snoozed, for a lease.Runner serving the same Call's Handle to make
	// synchronously, at the synchronous price. Empty: such a job fails
	// with class "deadline". It must be one of the store's queues, and not
	// Queue.
	SyncQueue string
	// Provider is the provider's batch API (provider/openai.NewBatches).
	Provider Provider
	// Calls are the kinds this submitter serves (Call.Batch), each with
	// the provider's codec.
	Calls []KindCall
	// Schema holds the llmq tables. Default "llmq".
	Schema string
	// ID names this submitter in the lease. Default host-pid-random.
	ID string
	// LeaseDuration is how long the pool's lease lasts without a renewal;
	// a standby takes over after it. Default 30s.
	LeaseDuration time.Duration
	// Window is the provider's completion window: a job whose deadline
	// is sooner than now+Window is not sent (it cannot be sure of its
	// answer in time) but fails with class "deadline". Default 24h, the
	// window both OpenAI and Anthropic promise.
	Window time.Duration
	// Grace is added to Window for the leases of submitted jobs: the time
	// a submitter has to read an ended batch's results. Default 1h.
	Grace time.Duration
	// GatherInterval is how often the waiting jobs are gathered into new
	// batches. Default 1m.
	GatherInterval time.Duration
	// PollMin and PollMax bound the delay between polls of one batch,
	// which grows by half with each poll. Defaults 10s and 5m.
	PollMin, PollMax time.Duration
	// Limits lowers the provider's limits (Provider.Limits): a zero field
	// keeps the provider's.
	Limits Limits
	// Retry is the backoff of a request the provider failed, and
	// RetryByKind per kind, as in lease.Config.
	Retry       llmqtype.BackoffPolicy
	RetryByKind map[string]llmqtype.BackoffPolicy
	// InvalidOutputAttempts and InvalidOutput are as in lease.Config, so
	// a kind's parser decides the same outcome on both paths.
	InvalidOutputAttempts int
	InvalidOutput         lease.InvalidOutputPolicy
	// OnSucceeded, when set, runs in the transaction that records each
	// successful result, as lease.Config.OnSucceeded does for a runner's:
	// give both the same hook, and a job's side effects (a webhook
	// delivery) are the same whichever path served it. If it keeps
	// failing (three times) for a result, the result is recorded as a
	// transient failure without the hook and the job goes back for a
	// later batch: the host's side effect is never skipped, at the price
	// of a second request.
	OnSucceeded lease.SucceededHook
	// Logger receives the submitter's logs. Default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	fail := func(field, problem string) (Config, error) {
		return c, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: field, Problem: problem}
	}
	switch {
	case c.Pool == "":
		return fail("Pool", "is required")
	case c.Queue == "":
		return fail("Queue", "is required")
	case c.SyncQueue != "" && c.SyncQueue == c.Queue:
		return fail("SyncQueue", fmt.Sprintf("is the batch queue %q itself; name a queue that lease.Runners serve", c.Queue))
	case c.Provider == nil:
		return fail("Provider", "is required")
	case len(c.Calls) == 0:
		return fail("Calls", "must hold at least one call (Call.Batch)")
	}
	seen := map[string]bool{}
	for i, call := range c.Calls {
		switch {
		case call.batched == nil:
			return fail(fmt.Sprintf("Calls[%d]", i), "is a zero KindCall; use Call.Batch")
		case seen[call.kind]:
			return fail(fmt.Sprintf("Calls[%d]", i), fmt.Sprintf("kind %q is served twice", call.kind))
		case call.provider != c.Provider.Name():
			return fail(fmt.Sprintf("Calls[%d]", i), fmt.Sprintf("kind %q speaks %q, not the provider's %q", call.kind, call.provider, c.Provider.Name()))
		}
		seen[call.kind] = true
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"LeaseDuration", c.LeaseDuration}, {"Window", c.Window}, {"Grace", c.Grace}, {"GatherInterval", c.GatherInterval}, {"PollMin", c.PollMin}, {"PollMax", c.PollMax}} {
		if d.v < 0 {
			return fail(d.name, fmt.Sprintf("is %s; must not be negative (0 means the default)", d.v))
		}
	}
	if c.Limits.MaxRequests < 0 || c.Limits.MaxBytes < 0 || c.Limits.MaxEnqueuedTokens < 0 {
		return fail("Limits", "must not be negative (0 keeps the provider's)")
	}
	if c.InvalidOutputAttempts < 0 {
		return fail("InvalidOutputAttempts", "must not be negative")
	}
	if err := c.Retry.Validate(); err != nil {
		return fail("Retry", err.Error())
	}
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	if c.LeaseDuration < time.Second {
		return fail("LeaseDuration", fmt.Sprintf("is %s; use at least 1s", c.LeaseDuration))
	}
	c.Window = cmp.Or(c.Window, DefaultWindow)
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.GatherInterval = cmp.Or(c.GatherInterval, DefaultGatherInterval)
	c.PollMin = cmp.Or(c.PollMin, DefaultPollMin)
	c.PollMax = cmp.Or(c.PollMax, DefaultPollMax)
	if c.PollMax < c.PollMin {
		return fail("PollMax", fmt.Sprintf("is %s, below PollMin %s", c.PollMax, c.PollMin))
	}
	c.InvalidOutputAttempts = cmp.Or(c.InvalidOutputAttempts, lease.DefaultInvalidOutputRuns)
	c.Retry = c.Retry.WithDefaults()
	if c.ID == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown-host"
		}
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func (c Config) backoff(kind string) llmqtype.BackoffPolicy {
	if p, ok := c.RetryByKind[kind]; ok {
		return p.WithDefaults()
	}
	return c.Retry
}
