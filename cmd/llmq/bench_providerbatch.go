package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	llmqopenai "github.com/llmq/llmq/provider/openai"
	"github.com/llmq/llmq/providerbatch"
)

// How `llmq bench -mode providerbatch` measures the provider batch path:
//
//   - It enqueues -jobs jobs of one kind to the batch queue, each needed two
//     days from now, vacuums, and checkpoints (as the drain does).
//   - A providerbatch.Submitter serves them over the provider's batch
//     adapter (provider/openai.NewBatches, or provider/anthropic with
//     -provider anthropic) against the fake provider, in process, on a
//     loopback HTTP server. The bench steps the submitter with Pass, as
//     Run would, so each phase's bounds are exact.
//   - Submit: the passes until every job is in a provider batch: gather
//     (claim, build, split), record (the submissions, their items and the
//     jobs' leases extended to the window) and create (upload, create,
//     record the provider's id).
//   - The provider's batch then runs for -batch-delay. When it is due, and
//     the submitter's first poll is due, the bench reads the batch through
//     the provider's API itself: that read is when the fake answers every
//     request and ends the batch, so the provider's own work (its model
//     answering 10,000 requests) is outside the timed part.
//   - Apply: from that end to the end of the pass that settled the last
//     job: the poll (the submission's items, the check for cancelled jobs,
//     the status), reading the results, and applying them in chunks.
//
// Each phase also reports the WAL it wrote and its round trips to
// PostgreSQL per job; the run's figures cover the submitter's whole work.

// Names the bench's jobs use.
const (
	benchBatchQueue  = "batch"
	benchBatchPool   = "bench"
	benchBatchTenant = "bench"
	benchBatchKind   = "bench.extract"
	// benchBatchDefaultJobs is -jobs when not given: a day's deferrable
	// backlog of a small service, and one OpenAI batch.
	benchBatchDefaultJobs = 10_000
	// benchBatchMostJobs is what one gather claims at most (the
	// submitter's bound, OpenAI's requests per batch): the bench times one
	// gather, so a larger backlog would overlap its phases.
	benchBatchMostJobs = 50_000
)

// addProviderBatchFlags adds the flags of -mode providerbatch.
func addProviderBatchFlags(fs *flag.FlagSet, o *benchOptions) {
	fs.StringVar(&o.provider, "provider", "openai", "providerbatch: the batch API the submitter speaks to the fake provider: openai (Files and Batches) or anthropic (Message Batches)")
	fs.DurationVar(&o.batchDelay, "batch-delay", time.Second, "providerbatch: how long the fake provider's batch runs before it ends (also the submitter's first poll)")
}

// providerBatchDefaults sets -jobs to the mode's default when it was not
// given: the other modes' default (50,000) is a gather's whole capacity.
func providerBatchDefaults(fs *flag.FlagSet, o *benchOptions) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "jobs" })
	if !given {
		o.jobs = benchBatchDefaultJobs
	}
}

// checkProviderBatchFlags refuses flags this mode cannot honour, naming
// the flag; flags of other modes (-workers, -broker, ...) are ignored,
// as the other modes ignore this one's.
func checkProviderBatchFlags(o benchOptions) error {
	switch {
	case o.jobs < 1 || o.jobs > benchBatchMostJobs:
		return fmt.Errorf("%w: -jobs %d: use 1 to %d with -mode providerbatch (one gather's most)", errUsage, o.jobs, benchBatchMostJobs)
	case o.provider != "openai" && o.provider != "anthropic":
		return fmt.Errorf("%w: -provider %q: use openai or anthropic", errUsage, o.provider)
	case o.batchDelay <= 0 || o.batchDelay > time.Hour:
		return fmt.Errorf("%w: -batch-delay %s: use more than 0 and at most 1h", errUsage, o.batchDelay)
	case o.walDetail && !o.walRecords:
		return fmt.Errorf("%w: -wal-detail needs the WAL records that -wal-records=false skips", errUsage)
	}
	return nil
}

// benchDoc is a job's arguments: the document the fake model extracts.
type benchDoc struct {
	Text string `json:"text"`
}

// benchInvoice is the i-th job's document, in the layout the fake model
// reads.
func benchInvoice(i int) string {
	return fmt.Sprintf("Supplier: Acme %d\nIBAN: DE89370400440532013000\nInvoice number: INV-%d\nTotal: %d.00 EUR\n", i, i, i+1)
}

// providerBatchReport is what the mode found.
type providerBatchReport struct {
	Mode     string `json:"mode"`
	Provider string `json:"provider"`
	Jobs     int    `json:"jobs"`
	// LoadAverage is the machine's 1-minute load average before the run,
	// -1 when /proc/loadavg cannot be read.
	LoadAverage       float64 `json:"load_avg_1m"`
	BatchDelaySeconds float64 `json:"batch_delay_s"`
	// Batches is the provider batches created, as the provider counted
	// them; FewestBatches the fewest the provider's limits allow for these
	// requests (MaxRequests a batch, and its bytes).
	Batches             int `json:"batches"`
	FewestBatches       int `json:"fewest_batches"`
	MaxRequestsPerBatch int `json:"max_requests_per_batch"`
	// SubmitSeconds is gather, record and create, the provider's create
	// calls (upload and create) included: CreateSeconds of it.
	SubmitSeconds float64 `json:"submit_s"`
	CreateSeconds float64 `json:"create_calls_s"`
	// EarlyPolls counts polls that found a batch still running (each
	// reads the submission's items; it writes only for jobs cancelled or
	// moved on meanwhile).
	EarlyPolls int `json:"early_polls"`
	// ApplySeconds runs from the provider batch's end to every job
	// settled: PollSeconds up to the status read that found it ended,
	// ResultsSeconds reading and applying the results, EndSeconds the rest
	// of the pass (ending the submission).
	ApplySeconds       float64 `json:"apply_s"`
	ApplyJobsPerSecond float64 `json:"apply_jobs_per_s"`
	PollSeconds        float64 `json:"apply_poll_s"`
	ResultsSeconds     float64 `json:"apply_results_s"`
	EndSeconds         float64 `json:"apply_end_s"`
	// NotSucceeded counts the jobs that are not SUCCEEDED after the run:
	// must be 0.
	NotSucceeded int         `json:"not_succeeded"`
	WAL          []walLine   `json:"wal"`
	RoundTrips   []tripsLine `json:"round_trips"`
}

// tripsLine is one phase's round trips to PostgreSQL per job, as the
// pool's tracer counts them: a statement, a transaction's BEGIN and
// COMMIT, a pipelined batch each one; Statements counts a batch's
// statements one by one.
type tripsLine struct {
	Phase             string  `json:"phase"`
	RoundTripsPerJob  float64 `json:"round_trips_per_job"`
	StatementsPerJob  float64 `json:"statements_per_job"`
	roundTrips, stmts int64
}

// runBenchProviderBatch runs -mode providerbatch.
func runBenchProviderBatch(ctx context.Context, c *common, o benchOptions, stdout, stderr io.Writer) error {
	if err := checkProviderBatchFlags(o); err != nil {
		return err
	}
	r := &providerBatchReport{Mode: o.mode, Provider: o.provider, Jobs: o.jobs, LoadAverage: loadAverage(), BatchDelaySeconds: o.batchDelay.Seconds()}
	progress := &lockedWriter{w: stderr}
	trips := &tripCounter{}
	pool, err := connectTraced(ctx, c.databaseURL, trips)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema, drop, err := throwawaySchema(ctx, pool, o.keep, stderr)
	if err != nil {
		return err
	}
	defer drop()
	fmt.Fprintf(stderr, "llmq bench: mode=providerbatch provider=%s jobs=%d batch_delay=%s load_avg_1m=%.2f schema=%s\n",
		o.provider, o.jobs, o.batchDelay, r.LoadAverage, schema)
	wal := newWALMeter(ctx, pool, schema, o.walRecords, progress)
	wal.perRelation = o.walDetail
	defer wal.close(ctx)
	store, err := jobs.NewStore(jobs.Config{Schema: schema, Queues: []string{jobs.DefaultQueue, benchBatchQueue}})
	if err != nil {
		return err
	}

	fake := fakeprovider.New(fakeprovider.Config{BatchDelay: o.batchDelay})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	provider, call, err := benchBatchProvider(o.provider, srv)
	if err != nil {
		return err
	}
	probe := &batchProbe{Provider: provider}
	sub, err := providerbatch.NewSubmitter(pool, store, providerbatch.Config{
		Pool: benchBatchPool, Queue: benchBatchQueue, Provider: probe, Calls: []providerbatch.KindCall{call},
		Schema: schema, ID: "bench-submitter",
		// The first pass gathers everything (a gather claims up to 50,000
		// jobs); no later pass needs to claim again.
		GatherInterval: time.Hour,
		// The first poll is due when the batch ends: no poll finds it
		// still running, unless the clocks disagree (early_polls).
		PollMin: o.batchDelay, PollMax: 4 * o.batchDelay,
		Logger: slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		return err
	}
	pb := &providerBatchBench{o: o, pool: pool, schema: schema, store: store, sub: sub, probe: probe, fake: fake,
		wal: wal, trips: trips, report: r, progress: progress}
	if err := pb.enqueue(ctx, call.Kind()); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer func() { _ = stopProfile() }()
	if err := pb.run(ctx); err != nil {
		return err
	}
	if err := pb.check(ctx); err != nil {
		return err
	}
	if err := r.print(c.json, stdout); err != nil {
		return err
	}
	if r.NotSucceeded > 0 {
		return fmt.Errorf("llmq bench: %d of %d jobs are not SUCCEEDED", r.NotSucceeded, r.Jobs)
	}
	return nil
}

// benchBatchProvider is the provider's batch API on the fake at srv, and
// the bench kind's call in that provider's codec. Its client does not
// retry, as Options sets it: the submitter owns retries.
func benchBatchProvider(name string, srv *httptest.Server) (providerbatch.Provider, providerbatch.KindCall, error) {
	kind := jobs.NewKind[benchDoc, fakeprovider.Extraction](benchBatchKind)
	if name == "anthropic" {
		client := sdk.NewClient(anthropicoption.WithBaseURL(srv.URL), anthropicoption.WithAPIKey("bench"),
			anthropicoption.WithMaxRetries(0), anthropicoption.WithHTTPClient(srv.Client()))
		build := func(_ context.Context, _ *jobs.Job, a benchDoc) (sdk.MessageNewParams, error) {
			return sdk.MessageNewParams{
				Model: "claude-bench", MaxTokens: 800, System: []sdk.TextBlockParam{{Text: "extract"}},
				Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(a.Text))},
			}, nil
		}
		parse := func(_ context.Context, _ *jobs.Job, _ benchDoc, m *sdk.Message) (fakeprovider.Extraction, error) {
			if len(m.Content) == 0 {
				return fakeprovider.Extraction{}, jobs.InvalidOutput(errors.New("the answer has no content"), nil)
			}
			return parseExtraction(m.Content[0].Text)
		}
		call := providerbatch.NewCall(kind, llmqanthropic.Messages{}, build, parse)
		return llmqanthropic.NewBatches(client, llmqanthropic.BatchesConfig{}), call.Batch(), nil
	}
	client := oai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("bench"),
		option.WithMaxRetries(0), option.WithHTTPClient(srv.Client()))
	build := func(_ context.Context, _ *jobs.Job, a benchDoc) (oai.ChatCompletionNewParams, error) {
		return oai.ChatCompletionNewParams{
			Model:    "gpt-bench",
			Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("extract"), oai.UserMessage(a.Text)},
		}, nil
	}
	parse := func(_ context.Context, _ *jobs.Job, _ benchDoc, c *oai.ChatCompletion) (fakeprovider.Extraction, error) {
		return parseExtraction(c.Choices[0].Message.Content)
	}
	batches, err := llmqopenai.NewBatches(client, llmqopenai.BatchesConfig{})
	if err != nil {
		return nil, providerbatch.KindCall{}, fmt.Errorf("llmq bench: %w", err)
	}
	return batches, providerbatch.NewCall(kind, llmqopenai.Chat{}, build, parse).Batch(), nil
}

// parseExtraction reads the model's extraction, as a kind's parser
// would: output that is not JSON is invalid output.
func parseExtraction(content string) (fakeprovider.Extraction, error) {
	var ex fakeprovider.Extraction
	if err := json.Unmarshal([]byte(content), &ex); err != nil {
		return ex, jobs.InvalidOutput(fmt.Errorf("the extraction is not JSON: %w", err), json.RawMessage(strconv.Quote(content)))
	}
	return ex, nil
}

// providerBatchBench is one run of the mode.
type providerBatchBench struct {
	o        benchOptions
	pool     *pgxpool.Pool
	schema   string
	store    *jobs.PostgresStore
	sub      *providerbatch.Submitter
	probe    *batchProbe
	fake     *fakeprovider.Server
	wal      *walMeter
	trips    *tripCounter
	report   *providerBatchReport
	progress io.Writer
}

// enqueue accepts the jobs, 5,000 a transaction, then vacuums and
// checkpoints, as the drain does before its timed part.
func (pb *providerBatchBench) enqueue(ctx context.Context, kind string) error {
	const chunk = 5000
	deadline := time.Now().Add(48 * time.Hour)
	from, err := pb.wal.mark(ctx)
	if err != nil {
		return err
	}
	started, trips := time.Now(), pb.trips.now()
	for done := 0; done < pb.o.jobs; done += chunk {
		params := make([]jobs.EnqueueParams, min(chunk, pb.o.jobs-done))
		for i := range params {
			payload, err := json.Marshal(benchDoc{Text: benchInvoice(done + i)})
			if err != nil {
				return fmt.Errorf("llmq bench: %w", err)
			}
			params[i] = jobs.EnqueueParams{Tenant: benchBatchTenant, Kind: kind, Queue: benchBatchQueue, Payload: payload,
				DeadlineAt: deadline, MaxAttempts: 3}
		}
		if _, err := pb.store.EnqueueMany(ctx, pb.pool, params); err != nil {
			return err
		}
	}
	pb.addTrips("enqueue", trips)
	fmt.Fprintf(pb.progress, "llmq bench: %d jobs enqueued to queue %q in %.1fs\n", pb.o.jobs, benchBatchQueue, time.Since(started).Seconds())
	if err := pb.measureWAL(ctx, "enqueue", from); err != nil {
		return err
	}
	if _, err := pb.pool.Exec(ctx, "VACUUM ANALYZE "+pb.schema+".tenant_queues, "+pb.schema+".jobs"); err != nil {
		return err
	}
	(&bench{pool: pb.pool, progress: pb.progress}).checkpoint(ctx)
	return nil
}

// run times the submit and apply phases.
func (pb *providerBatchBench) run(ctx context.Context) error {
	r := pb.report
	runFrom, err := pb.wal.mark(ctx)
	if err != nil {
		return err
	}
	trips := pb.trips.now()
	start := time.Now()
	err = pb.passUntil(ctx, "every job is in a provider batch", func() bool { return pb.probe.requests() >= pb.o.jobs })
	if err != nil {
		return err
	}
	submitted := time.Now()
	r.SubmitSeconds = submitted.Sub(start).Seconds()
	r.CreateSeconds = pb.probe.createTime().Seconds()
	pb.addTrips("submit", trips)
	if err := pb.measureWAL(ctx, "submit", runFrom); err != nil {
		return err
	}
	fmt.Fprintf(pb.progress, "llmq bench: %d jobs in %d provider batches after %.3fs; the batches run for %s\n",
		pb.o.jobs, len(pb.probe.batchIDs()), r.SubmitSeconds, pb.o.batchDelay)

	if err := pb.endBatches(ctx); err != nil {
		return err
	}
	applyFrom, err := pb.wal.mark(ctx)
	if err != nil {
		return err
	}
	trips = pb.trips.now()
	ended := time.Now()
	pb.probe.startApply()
	stopProgress := pb.reportApplied()
	err = pb.passUntil(ctx, "every job is settled", func() bool { return pb.probe.resultsRead() >= len(pb.probe.batchIDs()) })
	settled := time.Now()
	stopProgress()
	if err != nil {
		return err
	}
	pb.addTrips("apply", trips)
	r.ApplySeconds = settled.Sub(ended).Seconds()
	r.ApplyJobsPerSecond = float64(pb.o.jobs) / r.ApplySeconds
	statusAt, resultsAt := pb.probe.applyMarks()
	r.PollSeconds = statusAt.Sub(ended).Seconds()
	r.ResultsSeconds = resultsAt.Sub(statusAt).Seconds()
	r.EndSeconds = settled.Sub(resultsAt).Seconds()
	r.EarlyPolls = pb.probe.earlyPolls()
	fmt.Fprintf(pb.progress, "llmq bench: all %d jobs settled %.3fs after the provider batch ended\n", pb.o.jobs, r.ApplySeconds)
	if err := pb.measureWAL(ctx, "apply", applyFrom); err != nil {
		return err
	}
	// The run: submit, the wait (lease renewals), apply. Round trips of
	// the wait are the bench's own reads, so the run's are the phases'.
	if err := pb.measureWAL(ctx, "run", runFrom); err != nil {
		return err
	}
	var sum tripsLine
	for _, l := range r.RoundTrips {
		if l.Phase == "submit" || l.Phase == "apply" {
			sum.roundTrips, sum.stmts = sum.roundTrips+l.roundTrips, sum.stmts+l.stmts
		}
	}
	r.RoundTrips = append(r.RoundTrips, pb.tripsLine("run", sum.roundTrips, sum.stmts))
	return nil
}

// passUntil steps the submitter until done holds. A pass that fails ends
// the bench; so does benchStall without done.
func (pb *providerBatchBench) passUntil(ctx context.Context, what string, done func() bool) error {
	from := time.Now()
	for !done() {
		if err := pb.sub.Pass(ctx); err != nil {
			return fmt.Errorf("llmq bench: a submitter pass: %w", err)
		}
		if done() {
			return nil
		}
		if time.Since(from) > benchStall {
			return fmt.Errorf("llmq bench: after %s, still not %s (%d requests in %d batches created, %d batches read)",
				benchStall, what, pb.probe.requests(), len(pb.probe.batchIDs()), pb.probe.resultsRead())
		}
		// The next poll is not due yet: wait as Run's tick would, briefly.
		if !sleepUntil(ctx, time.Now().Add(5*time.Millisecond)) {
			return ctx.Err()
		}
	}
	return nil
}

// endBatches waits until the provider's batches are due to end and the
// submitter's first poll is due, then reads each batch through the
// provider's API, outside the submitter: the fake answers a batch's
// requests at the first read after its delay, so its work is done before
// the timed apply begins, as a real provider's is before llmq polls.
func (pb *providerBatchBench) endBatches(ctx context.Context) error {
	var wait float64 // seconds
	err := pb.pool.QueryRow(ctx, `SELECT coalesce(greatest(extract(epoch FROM max(next_poll_at) - clock_timestamp()), 0), 0)::float8
		FROM `+pb.schema+`.provider_submissions WHERE state <> 'ended'`).Scan(&wait)
	if err != nil {
		return fmt.Errorf("llmq bench: reading when the first poll is due: %w", err)
	}
	due := time.Now().Add(time.Duration(wait * float64(time.Second)))
	if !sleepUntil(ctx, later(due, pb.probe.lastCreate().Add(pb.o.batchDelay))) {
		return ctx.Err()
	}
	for _, id := range pb.probe.batchIDs() {
		from := time.Now()
		for {
			st, err := pb.probe.Provider.Status(ctx, id)
			if err != nil {
				return fmt.Errorf("llmq bench: reading provider batch %s: %w", id, err)
			}
			if st.Ended {
				break
			}
			if time.Since(from) > benchStall {
				return fmt.Errorf("llmq bench: provider batch %s still %s after %s", id, st.State, benchStall)
			}
			if !sleepUntil(ctx, time.Now().Add(5*time.Millisecond)) {
				return ctx.Err()
			}
		}
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// reportApplied prints the results applied every second until stopped.
func (pb *providerBatchBench) reportApplied() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fmt.Fprintf(pb.progress, "llmq bench: %d of %d results applied\n", pb.probe.applied.Load(), pb.o.jobs)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// measureWAL adds the WAL phase wrote since from, per job.
func (pb *providerBatchBench) measureWAL(ctx context.Context, phase string, from walMark) error {
	p, err := pb.wal.measure(ctx, from, pb.progress)
	if err != nil {
		return err
	}
	pb.report.WAL = append(pb.report.WAL, p.lines(phase, pb.o.jobs)...)
	return nil
}

func (pb *providerBatchBench) addTrips(phase string, from tripCount) {
	d := pb.trips.now().since(from)
	pb.report.RoundTrips = append(pb.report.RoundTrips, pb.tripsLine(phase, d.roundTrips, d.statements))
}

func (pb *providerBatchBench) tripsLine(phase string, roundTrips, stmts int64) tripsLine {
	n := float64(pb.o.jobs)
	return tripsLine{Phase: phase, RoundTripsPerJob: float64(roundTrips) / n, StatementsPerJob: float64(stmts) / n, roundTrips: roundTrips, stmts: stmts}
}

// check counts, outside the timed part, the jobs not SUCCEEDED, the
// batches the provider created, and the fewest its limits allow.
func (pb *providerBatchBench) check(ctx context.Context) error {
	r := pb.report
	var bytes int64
	err := pb.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state <> 'SUCCEEDED') FROM "+pb.schema+".jobs").Scan(&r.NotSucceeded)
	if err != nil {
		return fmt.Errorf("llmq bench: counting the jobs not SUCCEEDED: %w", err)
	}
	err = pb.pool.QueryRow(ctx, "SELECT coalesce(sum(bytes), 0)::bigint FROM "+pb.schema+".provider_submissions").Scan(&bytes)
	if err != nil {
		return fmt.Errorf("llmq bench: reading the submissions: %w", err)
	}
	r.Batches = int(pb.fake.Stats().BatchesCreated)
	limits := pb.probe.Limits()
	r.MaxRequestsPerBatch = limits.MaxRequests
	r.FewestBatches = 1
	if limits.MaxRequests > 0 {
		r.FewestBatches = max(r.FewestBatches, ceilDiv(int64(pb.o.jobs), int64(limits.MaxRequests)))
	}
	if limits.MaxBytes > 0 {
		r.FewestBatches = max(r.FewestBatches, ceilDiv(bytes, limits.MaxBytes))
	}
	return nil
}

func ceilDiv(a, b int64) int { return int((a + b - 1) / b) }

// print writes the report: a table and the WAL lines, the summary line
// last; with -json, one JSON object.
func (r *providerBatchReport) print(asJSON bool, out io.Writer) error {
	if asJSON {
		return json.NewEncoder(out).Encode(r)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	load := "unreadable"
	if r.LoadAverage >= 0 {
		load = fmt.Sprintf("%.2f", r.LoadAverage)
	}
	rows := [][2]string{
		{"provider", fmt.Sprintf("%s (fake, in process; batches end %s after creation)", r.Provider, time.Duration(r.BatchDelaySeconds*float64(time.Second)))},
		{"load average before the run", load},
		{"jobs", strconv.Itoa(r.Jobs)},
		{"provider batches created", fmt.Sprintf("%d (fewest possible %d, at %d requests a batch)", r.Batches, r.FewestBatches, r.MaxRequestsPerBatch)},
		{"gather+record+create", fmt.Sprintf("%.3f s (of which the provider's create calls %.3f s)", r.SubmitSeconds, r.CreateSeconds)},
		{"batch ended -> every job settled", fmt.Sprintf("%.3f s (poll %.3f s, results read and applied %.3f s, end %.3f s)", r.ApplySeconds, r.PollSeconds, r.ResultsSeconds, r.EndSeconds)},
		{"apply rate", fmt.Sprintf("%.0f jobs/s", r.ApplyJobsPerSecond)},
		{"polls finding a batch still running", strconv.Itoa(r.EarlyPolls)},
	}
	for _, w := range r.WAL {
		if w.Relation == "" {
			rows = append(rows, [2]string{"WAL per job, " + w.Phase, fmt.Sprintf("%.0f B", w.BytesPerJob)})
		}
	}
	for _, t := range r.RoundTrips {
		rows = append(rows, [2]string{"round trips per job, " + t.Phase, fmt.Sprintf("%.3f (statements %.3f)", t.RoundTripsPerJob, t.StatementsPerJob)})
	}
	rows = append(rows, [2]string{"jobs not SUCCEEDED", strconv.Itoa(r.NotSucceeded)})
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", row[0], row[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range r.WAL {
		w.print(out)
	}
	_, err := fmt.Fprintf(out, "llmq providerbatch provider=%s jobs=%d batches=%d fewest_batches=%d submit_s=%.3f apply_s=%.3f apply_jobs_per_s=%.0f not_succeeded=%d\n",
		r.Provider, r.Jobs, r.Batches, r.FewestBatches, r.SubmitSeconds, r.ApplySeconds, r.ApplyJobsPerSecond, r.NotSucceeded)
	return err
}

// loadAverage is the 1-minute load average, -1 when it cannot be read.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	first, _, _ := strings.Cut(string(b), " ")
	v, err := strconv.ParseFloat(first, 64)
	if err != nil {
		return -1
	}
	return v
}

// batchProbe is the provider as the submitter sees it, timing its calls:
// when each batch was created and with how many requests, when a status
// read first found a batch ended in the apply phase, and when its results
// were read and applied (the submitter applies them as it reads them).
type batchProbe struct {
	providerbatch.Provider

	applied atomic.Int64 // results passed to the submitter and applied, in the apply phase

	mu          sync.Mutex
	ids         []string
	created     int
	creating    time.Duration
	lastCreated time.Time
	applying    bool
	early       int
	statusAt    time.Time // the first ended status of the apply phase
	resultsAt   time.Time // the last results read
	read        int       // batches whose results were read
}

// Create implements providerbatch.Provider.
func (p *batchProbe) Create(ctx context.Context, b providerbatch.Batch) (string, error) {
	from := time.Now()
	id, err := p.Provider.Create(ctx, b)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.creating += time.Since(from)
	if err == nil {
		p.ids = append(p.ids, id)
		p.created += len(b.Requests)
		p.lastCreated = time.Now()
	}
	return id, err
}

// Status implements providerbatch.Provider.
func (p *batchProbe) Status(ctx context.Context, id string) (providerbatch.Status, error) {
	st, err := p.Provider.Status(ctx, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err != nil:
	case !st.Ended:
		p.early++
	case p.applying && p.statusAt.IsZero():
		p.statusAt = time.Now()
	}
	return st, err
}

// Results implements providerbatch.Provider.
func (p *batchProbe) Results(ctx context.Context, id string, fn func(providerbatch.Result) error) error {
	err := p.Provider.Results(ctx, id, func(r providerbatch.Result) error {
		err := fn(r)
		p.applied.Add(1)
		return err
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.read++
		p.resultsAt = time.Now()
	}
	return err
}

func (p *batchProbe) startApply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applying = true
	p.applied.Store(0)
	p.statusAt = time.Time{}
}

func (p *batchProbe) requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.created
}

func (p *batchProbe) batchIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.ids...)
}

func (p *batchProbe) createTime() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creating
}

func (p *batchProbe) lastCreate() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastCreated
}

func (p *batchProbe) resultsRead() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.read
}

func (p *batchProbe) earlyPolls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.early
}

func (p *batchProbe) applyMarks() (status, results time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusAt, p.resultsAt
}

// tripCounter counts what the bench's pool sends PostgreSQL, as a pgx
// tracer: in-process counting loads nothing it measures.
type tripCounter struct {
	roundTrips, statements atomic.Int64
}

// tripCount is a reading of the counter.
type tripCount struct{ roundTrips, statements int64 }

func (t *tripCounter) now() tripCount {
	return tripCount{roundTrips: t.roundTrips.Load(), statements: t.statements.Load()}
}

func (c tripCount) since(from tripCount) tripCount {
	return tripCount{roundTrips: c.roundTrips - from.roundTrips, statements: c.statements - from.statements}
}

// TraceQueryStart implements pgx.QueryTracer: a statement on its own is
// one round trip (BEGIN and COMMIT included).
func (t *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.roundTrips.Add(1)
	t.statements.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *tripCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer: a batch is sent as one
// pipeline, one round trip.
func (t *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.roundTrips.Add(1)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer: each statement of a batch.
func (t *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	t.statements.Add(1)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *tripCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// connectTraced opens the bench's pool with trips counting its traffic.
// The submitter uses a few connections at a time; eight leave room for the
// bench's own reads.
func connectTraced(ctx context.Context, url string, trips *tripCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}
