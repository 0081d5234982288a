package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/admission"
)

// planInput is what `llmq plan` computes from.
type planInput struct {
	RPM             float64       `json:"rpm"`
	TPM             float64       `json:"tpm"`
	Concurrency     float64       `json:"concurrency"`
	MeanLatency     time.Duration `json:"-"`
	ReservedTokens  float64       `json:"reserved_tokens"`
	AttemptsPerJob  float64       `json:"attempts_per_job"`
	Backlog         float64       `json:"backlog"`
	ArrivalsPerHour float64       `json:"arrivals_per_hour"`
}

// planResult is the arithmetic, every rate per second.
type planResult struct {
	Input               planInput `json:"input"`
	MeanLatencySeconds  float64   `json:"mean_latency_seconds"`
	RequestLimited      float64   `json:"request_limited_attempts_per_s"`
	TokenLimited        float64   `json:"token_limited_attempts_per_s"`
	ConcurrencyLimited  float64   `json:"concurrency_limited_attempts_per_s"`
	AttemptCapacity     float64   `json:"attempt_capacity_per_s"`
	Binding             string    `json:"binding"`
	JobCapacity         float64   `json:"job_capacity_per_s"`
	DrainSeconds        float64   `json:"drain_seconds"`
	DrainWithArrivals   float64   `json:"drain_with_arrivals_seconds"` // -1: never, arrivals reach capacity
	ArrivalsPerSecond   float64   `json:"arrivals_per_s"`
	HeadroomForArrivals float64   `json:"headroom_jobs_per_s"`
}

// computePlan is the seed's formula: attempt capacity = min(RPM/60,
// TPM/(60·reserved tokens), concurrency/mean latency); job capacity is that
// over attempts per job; a backlog drains in backlog/capacity, or
// backlog/(capacity - arrivals) while work keeps arriving.
func computePlan(in planInput) planResult {
	r := planResult{Input: in, MeanLatencySeconds: in.MeanLatency.Seconds()}
	r.RequestLimited = in.RPM / 60
	r.TokenLimited = in.TPM / (60 * in.ReservedTokens)
	r.ConcurrencyLimited = in.Concurrency / in.MeanLatency.Seconds()
	r.AttemptCapacity, r.Binding = r.RequestLimited, "requests (RPM)"
	if r.TokenLimited < r.AttemptCapacity {
		r.AttemptCapacity, r.Binding = r.TokenLimited, "tokens (TPM)"
	}
	if r.ConcurrencyLimited < r.AttemptCapacity {
		r.AttemptCapacity, r.Binding = r.ConcurrencyLimited, "concurrency"
	}
	r.JobCapacity = r.AttemptCapacity / in.AttemptsPerJob
	r.DrainSeconds = in.Backlog / r.JobCapacity
	r.ArrivalsPerSecond = in.ArrivalsPerHour / 3600
	r.HeadroomForArrivals = r.JobCapacity - r.ArrivalsPerSecond
	r.DrainWithArrivals = -1
	if r.HeadroomForArrivals > 0 {
		r.DrainWithArrivals = in.Backlog / r.HeadroomForArrivals
	}
	return r
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("plan", stderr)
	var (
		in   planInput
		pool string
	)
	fs.StringVar(&pool, "pool", "", "read -rpm, -tpm and -concurrency from this admission pool in the database (those given explicitly win)")
	fs.Float64Var(&in.RPM, "rpm", 0, "provider requests per minute")
	fs.Float64Var(&in.TPM, "tpm", 0, "provider tokens per minute")
	fs.Float64Var(&in.Concurrency, "concurrency", 0, "calls in flight at once (the pool's MaxInFlight, or the workers)")
	fs.DurationVar(&in.MeanLatency, "latency", 15*time.Second, "mean latency of one provider call")
	fs.Float64Var(&in.ReservedTokens, "tokens", 4000, "tokens reserved per call (prompt + max output)")
	fs.Float64Var(&in.AttemptsPerJob, "attempts-per-job", 1, "mean attempts per job (1.1 when one job in ten is retried once)")
	fs.Float64Var(&in.Backlog, "backlog", 10_000, "jobs waiting")
	fs.Float64Var(&in.ArrivalsPerHour, "arrivals-per-hour", 0, "new jobs per hour while the backlog drains")
	var local localPlanInput
	var contexts string
	fs.Float64Var(&local.KVTokens, "kv-tokens", 0, "plan a local inference pool with this in-flight token budget (its server's KV cache); the flags below apply")
	fs.StringVar(&contexts, "contexts", "2500:0.8,60000:0.2", "local: the backlog's prompts as tokens:fraction,...")
	fs.Float64Var(&local.MaxTokens, "max-tokens", 1000, "local: max_tokens of each call, reserved with its prompt")
	fs.Float64Var(&local.OutputTokens, "output-tokens", 800, "local: tokens each call generates on average")
	fs.DurationVar(&local.PrefillPerToken, "prefill-per-token", 50*time.Microsecond, "local: the server's prefill time per prompt token")
	fs.DurationVar(&local.DecodeStep, "decode-step", 25*time.Millisecond, "local: one decode step of the server's batch")
	if err := parse(fs, args); err != nil {
		return err
	}
	if setFlags(fs)["kv-tokens"] {
		return runLocalPlan(ctx, c, stdout, local, contexts, in.Backlog, pool)
	}
	if pool != "" {
		if err := loadPlanPool(ctx, c, pool, &in, setFlags(fs)); err != nil {
			return err
		}
	}
	switch {
	case !(in.RPM > 0) || !(in.TPM > 0) || !(in.Concurrency > 0):
		return fmt.Errorf("%w: -rpm, -tpm and -concurrency must be positive (or give -pool)", errUsage)
	case in.MeanLatency <= 0 || !(in.ReservedTokens > 0) || !(in.AttemptsPerJob >= 1):
		return fmt.Errorf("%w: -latency and -tokens must be positive and -attempts-per-job at least 1", errUsage)
	case !(in.Backlog >= 0) || !(in.ArrivalsPerHour >= 0) || math.IsInf(in.Backlog, 0) || math.IsInf(in.ArrivalsPerHour, 0):
		return fmt.Errorf("%w: -backlog and -arrivals-per-hour must be finite and not negative", errUsage)
	}
	r := computePlan(in)
	if c.json {
		return writeJSON(stdout, r)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "requests\t%g RPM / 60\t= %.3f attempts/s\t\n", in.RPM, r.RequestLimited)
	fmt.Fprintf(tw, "tokens\t%g TPM / (60 × %g tokens)\t= %.3f attempts/s\t\n", in.TPM, in.ReservedTokens, r.TokenLimited)
	fmt.Fprintf(tw, "concurrency\t%g in flight / %s\t= %.3f attempts/s\t\n", in.Concurrency, in.MeanLatency, r.ConcurrencyLimited)
	fmt.Fprintf(tw, "attempt capacity\tmin of the above, bound by %s\t= %.3f attempts/s (%.0f/h)\t\n", r.Binding, r.AttemptCapacity, r.AttemptCapacity*3600)
	fmt.Fprintf(tw, "job capacity\t/ %g attempts per job\t= %.3f jobs/s (%.0f/h)\t\n", in.AttemptsPerJob, r.JobCapacity, r.JobCapacity*3600)
	fmt.Fprintf(tw, "drain %g jobs\tno arrivals\t= %s\t\n", in.Backlog, planDuration(r.DrainSeconds))
	if r.DrainWithArrivals < 0 {
		fmt.Fprintf(tw, "drain %g jobs\twith %g arrivals/h\t= never: arrivals reach capacity\t\n", in.Backlog, in.ArrivalsPerHour)
	} else {
		fmt.Fprintf(tw, "drain %g jobs\twith %g arrivals/h\t= %s\t\n", in.Backlog, in.ArrivalsPerHour, planDuration(r.DrainWithArrivals))
	}
	return tw.Flush()
}

// runLocalPlan is `llmq plan -kv-tokens`: the admissible concurrency and
// drain time of a local inference pool (see computeLocalPlan). With -pool,
// a pool's MaxInFlightTokens is the budget when -kv-tokens is 0.
func runLocalPlan(ctx context.Context, c *common, stdout io.Writer, in localPlanInput, contexts string, backlog float64, pool string) error {
	shares, err := parseContexts(contexts)
	if err != nil {
		return fmt.Errorf("%w: -contexts: %w", errUsage, err)
	}
	in.Contexts, in.Backlog = shares, backlog
	if pool != "" && in.KVTokens == 0 {
		budget, err := loadPlanBudget(ctx, c, pool)
		if err != nil {
			return err
		}
		in.KVTokens = budget
	}
	if err := checkLocalPlan(in); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	r := computeLocalPlan(in)
	if c.json {
		return writeJSON(stdout, r)
	}
	return printLocalPlan(stdout, r)
}

// loadPlanBudget reads a pool's in-flight token budget.
func loadPlanBudget(ctx context.Context, c *common, name string) (float64, error) {
	pool, err := c.connect(ctx)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: c.schema})
	if err != nil {
		return 0, err
	}
	s, err := l.State(ctx, name)
	if err != nil {
		return 0, err
	}
	if s.MaxInFlightTokens == 0 {
		return 0, fmt.Errorf("%w: pool %q has no in-flight token budget; give -kv-tokens", errUsage, name)
	}
	return float64(s.MaxInFlightTokens), nil
}

// loadPlanPool fills the limits from an admission pool, except those given
// explicitly (set), which are what the operator asks about: "this pool at
// twice its RPM".
func loadPlanPool(ctx context.Context, c *common, name string, in *planInput, set map[string]bool) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: c.schema})
	if err != nil {
		return err
	}
	s, err := l.State(ctx, name)
	if err != nil {
		return err
	}
	if !set["rpm"] {
		in.RPM = float64(s.RPM)
	}
	if !set["tpm"] {
		in.TPM = float64(s.TPM)
	}
	if !set["concurrency"] {
		in.Concurrency = float64(s.MaxInFlight)
	}
	return nil
}

func planDuration(seconds float64) string {
	if seconds > 100*365*24*3600 {
		return "more than a century"
	}
	return time.Duration(seconds * float64(time.Second)).Round(time.Second).String()
}
