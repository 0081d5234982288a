package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/outbox"
)

// benchOptions are the flags of `llmq bench`.
type benchOptions struct {
	mode       string
	jobs       int
	workers    int
	producers  int
	rate       float64
	batch      int
	notifyEach time.Duration
	keep       bool
	cpuProfile string
	memProfile string
	tenants    int
	backlog    int
	broker     string // relay: memory, rabbitmq or kafka; ingress: memory or rabbitmq
	amqpURL    string
	window     int
	walDetail  bool
	walRecords bool          // drain, e2e: read each phase's WAL records back (pg_walinspect)
	arrivals   float64       // admission: offered acquires per second over all processes; 0 is a closed loop
	hold       time.Duration // admission: how long each acquirer holds its permit, modelling the provider call
	history    int           // drain: finished jobs written up front (bench_history.go)
	batchSize  int           // drain: the backlog as batches (EnqueueBatch) of this many jobs; 0: no batches
	deletePub  bool          // relay: outbox.RelayConfig.DeletePublished
	provider   string        // providerbatch: openai or anthropic
	batchDelay time.Duration // providerbatch: how long the fake provider's batch runs
	keys       int           // reuse: reuse keys the jobs draw from, each tenant's own
	failRate   float64       // reuse: share of paid calls that fail transiently
}

const benchKind = "bench.noop"

// benchStall is how long a bench waits without any job finishing before it
// gives up and says so. A no-op job finishes in milliseconds; a minute
// covers a checkpoint or a lost connection being retried.
const benchStall = time.Minute

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if isSoak(args) {
		return runBenchSoak(ctx, args, stdout, stderr)
	}
	fs, c, o, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	if schema := os.Getenv(benchRelayChild); schema != "" && o.mode == "relay" {
		index, err := strconv.Atoi(os.Getenv(benchRelayIndex))
		if err != nil {
			return fmt.Errorf("%w: %s=%q is not a relay number", errUsage, benchRelayIndex, os.Getenv(benchRelayIndex))
		}
		return benchRelayWorker(ctx, c, o, schema, index, os.Stdin, stdout, stderr)
	}
	switch {
	case o.mode == "admission":
		return runBenchAdmission(ctx, c, o, stdout, stderr)
	case o.mode == "providerbatch":
		providerBatchDefaults(fs, &o)
		return runBenchProviderBatch(ctx, c, o, stdout, stderr)
	case o.mode == "reuse":
		reuseDefaults(fs, &o)
		return runBenchReuse(ctx, c, o, stdout, stderr)
	case o.mode != "drain" && o.mode != "e2e" && o.mode != "latency" && o.mode != "relay" && o.mode != "ingress":
		return fmt.Errorf("%w: -mode %q: use drain, e2e, latency, relay, ingress, admission, providerbatch or reuse", errUsage, o.mode)
	case o.broker != "memory" && o.broker != "rabbitmq" && o.broker != "kafka":
		return fmt.Errorf("%w: -broker %q: use memory, rabbitmq or kafka", errUsage, o.broker)
	case o.broker == "kafka" && o.mode == "ingress":
		return fmt.Errorf("%w: -mode ingress: use -broker memory or rabbitmq", errUsage)
	case o.jobs < 1 || o.workers < 1 || o.producers < 1 || o.rate <= 0 || o.tenants < 1:
		return fmt.Errorf("%w: -jobs, -workers, -producers, -rate and -tenants must be positive", errUsage)
	case o.backlog != 0 && o.backlog < o.jobs:
		return fmt.Errorf("%w: -backlog %d is smaller than -jobs %d", errUsage, o.backlog, o.jobs)
	case o.batchSize < 0 || o.batchSize > jobs.MaxBatch:
		return fmt.Errorf("%w: -batch-size %d: use 1 to %d, or 0 for no batches", errUsage, o.batchSize, jobs.MaxBatch)
	case o.batchSize > 0 && (o.mode != "drain" || o.tenants != 1):
		return fmt.Errorf("%w: -batch-size is for -mode drain with one tenant (a batch is one tenant's)", errUsage)
	case o.walDetail && !o.walRecords:
		return fmt.Errorf("%w: -wal-detail needs the WAL records that -wal-records=false skips", errUsage)
	case o.deletePub && o.mode != "relay":
		return fmt.Errorf("%w: -delete-published is for -mode relay", errUsage)
	}
	o.backlog = max(o.backlog, o.jobs)
	pool, err := c.connectBench(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()

	schema, drop, err := throwawaySchema(ctx, pool, o.keep, stderr)
	if err != nil {
		return err
	}
	defer drop()
	b := &bench{o: o, pool: pool, schema: schema, progress: &lockedWriter{w: stderr}, started: map[uuid.UUID]time.Time{}, unfinished: make(chan error, 1),
		report: &benchReport{asJSON: c.json, out: stdout, Mode: o.mode, Jobs: o.jobs, Workers: o.workers}}
	if o.mode == "drain" || o.mode == "e2e" {
		b.wal = newWALMeter(ctx, pool, schema, o.walRecords, b.progress)
		b.wal.perRelation = o.walDetail
		defer b.wal.close(ctx)
	}
	b.store, err = jobs.NewStore(jobs.Config{Schema: schema, NotifyInterval: o.notifyEach})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "llmq bench: mode=%s jobs=%d workers=%d tenants=%d backlog=%d schema=%s\n", o.mode, o.jobs, o.workers, o.tenants, o.backlog, schema)
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer func() { _ = stopProfile() }()
	if o.memProfile != "" {
		defer writeAllocProfile(o.memProfile, stderr)
	}
	var seconds float64
	switch o.mode {
	case "drain":
		seconds, err = b.drain(ctx)
	case "e2e":
		seconds, err = b.e2e(ctx)
	case "latency":
		seconds, err = b.latency(ctx)
	case "relay":
		switch o.broker {
		case "rabbitmq":
			seconds, err = b.relayRabbitMQ(ctx)
		case "kafka":
			seconds, err = b.relayKafka(ctx)
		default:
			seconds, err = b.relay(ctx, c)
		}
	case "ingress":
		seconds, err = b.ingress(ctx)
	}
	if err != nil {
		return err
	}
	return b.report.finish(seconds)
}

// writeAllocProfile writes the runtime's allocs profile (every allocation
// since the process started, sampled) to path; a failure is reported on
// stderr and does not fail the run whose figures are already printed.
func writeAllocProfile(path string, stderr io.Writer) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "llmq bench: writing the allocation profile: %v\n", err)
	}
}

// parseBenchFlags builds the flag set of `llmq bench` (every mode but
// soak, which has its own) and parses args with it, connecting to
// nothing and running nothing; docs/performance.md's commands are
// checked against it (perfdoc_test.go).
func parseBenchFlags(args []string, stderr io.Writer) (*flag.FlagSet, *common, benchOptions, error) {
	fs, c := newFlagSet("bench", stderr)
	var o benchOptions
	fs.StringVar(&o.mode, "mode", "drain", "drain: work down a backlog enqueued up front; e2e: producers enqueue while the runner works; latency: open-loop arrivals at -rate, enqueue-to-start latency; relay: publish a backlog of -jobs outbox events to -broker with -workers relays, each running as a pod's would (processes with the memory broker, goroutines otherwise), and print their peak connections; ingress: publish -jobs messages to -broker, then time an inbox ingress with -workers concurrent batches taking them all; providerbatch: send -jobs deferrable jobs through a providerbatch.Submitter to an in-process fake provider's batch API and time submitting them and applying the results; reuse: -producers processes (default 8), each running its share of -workers handlers, enqueue -jobs jobs (default 10,000) with reuse keys drawn from -keys, each handler call paid and counted; reports paid calls, reused jobs and jobs_reuse_idx probes, then runs the same jobs without reuse keys")
	fs.IntVar(&o.jobs, "jobs", 50_000, "number of jobs (providerbatch: default 10,000, at most 50,000; reuse: default 10,000)")
	fs.IntVar(&o.workers, "workers", 100, "runner concurrency (MaxWorkers of the queue); relay: relays competing for one outbox; reuse: handlers of all processes together")
	fs.IntVar(&o.producers, "producers", 16, "e2e: concurrent producers, each enqueueing one job (and its outbox event) per transaction; reuse: processes, each enqueueing its share and running its share of -workers (default 8)")
	fs.Float64Var(&o.rate, "rate", 100, "latency: arrivals per second")
	fs.IntVar(&o.batch, "claim-batch", 0, "jobs per claim (0: 500 for drain, 100 for e2e, 10 for latency, never more than -workers; reuse: each process's share of -workers); events per relay claim (0: 500)")
	fs.DurationVar(&o.notifyEach, "notify-interval", 0, "jobs.Config.NotifyInterval of the producers' store (0: its default, 5ms; negative: NOTIFY on every enqueue)")
	fs.IntVar(&o.tenants, "tenants", 1, "drain: tenants the backlog is spread over, round robin (fair claiming shares claims among them); reuse: tenants drawn at random for each job, each with its own -keys")
	fs.IntVar(&o.backlog, "backlog", 0, "drain: jobs queued up front (0: -jobs); the bench times the first -jobs of them")
	fs.IntVar(&o.batchSize, "batch-size", 0, fmt.Sprintf("drain: enqueue the backlog as batches (jobs.EnqueueBatch) of this many jobs, 1 to %d, so every completion also keeps its batch's counts; 0: no batches", jobs.MaxBatch))
	fs.BoolVar(&o.deletePub, "delete-published", false, "relay: the relays delete each event once the broker confirmed it (outbox.RelayConfig.DeletePublished) instead of marking it published")
	fs.BoolVar(&o.walDetail, "wal-detail", false, "drain, e2e: also print each relation's share of every phase's WAL (needs pg_walinspect)")
	fs.BoolVar(&o.walRecords, "wal-records", true, "drain, e2e: read each phase's WAL records back with pg_walinspect for rows, index entries and HOT share; false prints WAL totals only, so the server spends no CPU reading its WAL (for measuring the server's CPU per job from outside)")
	fs.BoolVar(&o.keep, "keep", false, "keep the throwaway schema instead of dropping it")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured phase to this file (admission: each bench process writes its own, to this file's name followed by .<process>)")
	fs.StringVar(&o.memProfile, "memprofile", "", "drain, e2e, latency, relay, ingress: write the allocations of the whole run (the Go runtime's allocs profile) to this file at its end")
	fs.StringVar(&o.broker, "broker", "memory", "relay: memory, rabbitmq, or kafka (in-process kfake unless KAFKA_BROKERS is set); ingress: memory or rabbitmq")
	fs.StringVar(&o.amqpURL, "amqp-url", os.Getenv("AMQP_URL"), "rabbitmq: the broker (default $AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/)")
	fs.IntVar(&o.window, "window", 0, "rabbitmq: unconfirmed publishes in flight (0: the publisher's default)")
	fs.Float64Var(&o.arrivals, "arrivals", 0, "admission: acquires per second offered over all processes, each timed from its scheduled arrival (0: a closed loop, each acquirer acquiring again as soon as it released)")
	fs.DurationVar(&o.hold, "hold", 0, "admission: how long each acquirer holds its permit before releasing it, modelling the provider call (0: released at once); reuse: how long each paid call takes (default 5ms)")
	fs.IntVar(&o.keys, "keys", 1000, "reuse: reuse keys the jobs draw from at random (jobs.ReuseKey of the key's number), each tenant's its own")
	fs.Float64Var(&o.failRate, "fail-rate", 0.02, "reuse: share of paid calls that fail transiently after paying (the job is retried)")
	addHistoryFlag(fs, &o)
	addProviderBatchFlags(fs, &o)
	err := parse(fs, args)
	return fs, c, o, err
}

// throwawaySchema migrates a fresh schema for one bench run and returns
// its name and drop, which removes it unless keep is set.
func throwawaySchema(ctx context.Context, pool *pgxpool.Pool, keep bool, stderr io.Writer) (schema string, drop func(), err error) {
	schema = "llmq_bench_" + randomSuffix()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema}); err != nil {
		return "", nil, err
	}
	drop = func() {
		if keep {
			return
		}
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := pool.Exec(dropCtx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			fmt.Fprintf(stderr, "llmq bench: dropping schema %s: %v\n", schema, err)
		}
	}
	return schema, drop, nil
}

func (c *common) connectBench(ctx context.Context, o benchOptions) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = int32(min(o.producers+8, 64))
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

type bench struct {
	o              benchOptions
	pool           *pgxpool.Pool
	store          *jobs.PostgresStore
	schema         string
	report         *benchReport
	wal            *walMeter // drain and e2e
	progress       io.Writer
	recorded       atomic.Int64 // successes durably recorded
	saidUnrecorded atomic.Bool  // an outcome the runner failed to record was reported on progress
	// unfinished ends waitDone: a job that ended other than SUCCEEDED.
	unfinished chan error
	// stallAfter ends waitDone when no job has finished for that long
	// (0: benchStall).
	stallAfter time.Duration
	// runnerFrom is the database's clock just before the runner started:
	// every job the runner finishes, finishes after it (see waitDone).
	runnerFrom time.Time

	mu      sync.Mutex
	started map[uuid.UUID]time.Time // latency mode: when each job's handler started
}

// startRunner runs a runner with a no-op handler until the returned stop is
// called.
func (b *bench) startRunner(ctx context.Context, claimBatch int) (stop func() error, err error) {
	if err := b.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&b.runnerFrom); err != nil {
		return nil, err
	}
	handler := lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
		if b.o.mode == "latency" {
			now := time.Now()
			b.mu.Lock()
			b.started[job.ID] = now
			b.mu.Unlock()
		}
		return nil, nil
	})
	r, err := lease.NewRunner(b.pool, b.store, lease.Config{
		Handlers:    map[string]lease.Handler{benchKind: handler},
		Queues:      map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: b.o.workers}},
		ClaimBatch:  claimBatch,
		AfterRecord: b.afterRecord,
	})
	if err != nil {
		return nil, err
	}
	return runInBackground(ctx, r), nil
}

// runInBackground runs r (a runner, a relay) until the returned stop is
// called; stop returns what Run returned.
func runInBackground(ctx context.Context, r interface{ Run(context.Context) error }) (stop func() error) {
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	return func() error { cancel(); return <-done }
}

// afterRecord counts the bench's successes. A job that ended otherwise
// ends the bench with the reason, where waiting on would never end. An
// outcome that could not be recorded (a lost lease, a failed commit) is
// said once on the progress output: its job comes back through the reaper
// and may still succeed, so the wait goes on, bounded by stallAfter.
func (b *bench) afterRecord(job *jobs.Job, err error) {
	switch {
	case err != nil:
		if b.saidUnrecorded.CompareAndSwap(false, true) {
			fmt.Fprintf(b.progress, "llmq bench: an outcome was not recorded (its job comes back after its lease expires): %v\n", err)
		}
	case job.State == jobs.StateSucceeded:
		b.recorded.Add(1)
	case job.State.Terminal():
		b.finishEarly(fmt.Errorf("llmq bench: job %s ended %s, not SUCCEEDED: %s", job.ID, job.State, job.LastError))
	}
}

// finishEarly hands waitDone the first reason to stop waiting.
func (b *bench) finishEarly(err error) {
	select {
	case b.unfinished <- err:
	default: // a reason is already waiting
	}
}

// tenant names the tenant of the i-th job of a backlog.
func (b *bench) tenant(i int) string {
	if b.o.tenants == 1 {
		return "bench"
	}
	return fmt.Sprintf("tenant-%d", i%b.o.tenants)
}

func (b *bench) claimBatch(def int) int {
	if b.o.batch > 0 {
		return b.o.batch
	}
	return min(def, b.o.workers)
}

// waitDone waits until the runner has recorded every job's success,
// reporting progress, and returns when it had: the end of the timed part.
// Counting in process keeps the measurement from loading the database it
// measures. It then checks, outside the timed part, that the database
// agrees, counting only the jobs finished since the runner started
// (runnerFrom) through jobs_finished_idx: a -history run's finished jobs
// are not the bench's, and counting every SUCCEEDED job would read the
// whole table.
func (b *bench) waitDone(ctx context.Context) (time.Time, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	stallAfter := cmp.Or(b.stallAfter, benchStall)
	lastReport, lastProgress, lastCount := time.Now(), time.Now(), int64(0)
	for b.recorded.Load() < int64(b.o.jobs) {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case err := <-b.unfinished:
			return time.Time{}, err
		case <-tick.C:
		}
		if n := b.recorded.Load(); n != lastCount {
			lastProgress, lastCount = time.Now(), n
		} else if time.Since(lastProgress) >= stallAfter {
			return time.Time{}, fmt.Errorf("llmq bench: no job finished for %s; %d of %d jobs done", stallAfter, n, b.o.jobs)
		}
		if time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(b.progress, "llmq bench: %d of %d jobs done\n", b.recorded.Load(), b.o.jobs)
		}
	}
	done := time.Now()
	var succeeded int
	err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".jobs WHERE state = 'SUCCEEDED' AND finished_at >= $1", b.runnerFrom).Scan(&succeeded)
	if err != nil {
		return time.Time{}, err
	}
	if succeeded < b.o.jobs {
		return time.Time{}, fmt.Errorf("llmq bench: %d jobs are SUCCEEDED after %d successes were recorded", succeeded, b.o.jobs)
	}
	return done, nil
}

// drain enqueues the backlog, vacuums, then times a runner working down
// the first -jobs of it. It prints the WAL written per job by each phase
// (insert, vacuum, drain) and by the whole run; the run's figure is per job
// of the backlog, so it is the cost of a job's whole life when -backlog is
// -jobs (the default).
func (b *bench) drain(ctx context.Context) (float64, error) {
	if err := b.fillHistory(ctx); err != nil {
		return 0, err
	}
	// A checkpoint before the backlog is written: a run with -history
	// leaves gigabytes for the checkpointer and the kernel to write back,
	// which would otherwise land on the timed drain. Every page the drain
	// changes is then changed first by the insert or the vacuum after it,
	// so the drain's WAL holds no full-page images from it.
	b.checkpoint(ctx)
	whole, err := b.wal.mark(ctx)
	if err != nil {
		return 0, err
	}
	if err := b.wal.phase(ctx, b.report, b.progress, "insert", b.o.backlog, func() error { return b.enqueueBacklog(ctx) }); err != nil {
		return 0, err
	}
	// Start from a vacuumed, analysed table, as a long-running system with
	// autovacuum would be (some machines run with autovacuum off).
	err = b.wal.phase(ctx, b.report, b.progress, "vacuum", b.o.backlog, func() error {
		_, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+b.schema+".tenant_queues, "+b.schema+".jobs")
		return err
	})
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(b.progress, "llmq bench: %d jobs of %d tenants enqueued; draining %d\n", b.o.backlog, b.o.tenants, b.o.jobs)
	from, err := b.wal.mark(ctx)
	if err != nil {
		return 0, err
	}
	cpuFrom, start := sampleCPU(), time.Now()
	stop, err := b.startRunner(ctx, b.claimBatch(500))
	if err != nil {
		return 0, err
	}
	done, err := b.waitDone(ctx)
	b.report.cpu(cpuFrom, sampleCPU(), b.o.jobs)
	elapsed := done.Sub(start).Seconds()
	if stopErr := stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return 0, err
	}
	// Per job completed: the runner may finish a few beyond -jobs before it
	// stops.
	if err := b.printWAL(ctx, "drain", int(b.recorded.Load()), from); err != nil {
		return 0, err
	}
	return elapsed, b.printWAL(ctx, "run", b.o.backlog, whole)
}

func (b *bench) printWAL(ctx context.Context, phase string, n int, from walMark) error {
	p, err := b.wal.measure(ctx, from, b.progress)
	if err != nil {
		return err
	}
	b.report.wal(p.lines(phase, n)...)
	return nil
}

// enqueueBacklog enqueues -backlog jobs in batches of 5,000, one batch per
// transaction, spread over -tenants; with -batch-size, as batches of jobs
// (EnqueueBatch) of that size, one per transaction.
func (b *bench) enqueueBacklog(ctx context.Context) error {
	batch := 5000
	if b.o.batchSize > 0 {
		batch = b.o.batchSize
	}
	lastReport := time.Now()
	for done := 0; done < b.o.backlog; done += batch {
		n := min(batch, b.o.backlog-done)
		params := make([]jobs.EnqueueParams, n)
		for i := range params {
			params[i] = jobs.EnqueueParams{Tenant: b.tenant(done + i), Kind: benchKind}
		}
		var err error
		if b.o.batchSize > 0 {
			_, err = b.store.EnqueueBatch(ctx, b.pool, jobs.EnqueueBatchParams{Tenant: b.tenant(0), Key: "bench-" + strconv.Itoa(done), Jobs: params})
		} else {
			_, err = b.store.EnqueueMany(ctx, b.pool, params)
		}
		if err != nil {
			return err
		}
		if time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(b.progress, "llmq bench: %d of %d jobs enqueued\n", done+n, b.o.backlog)
		}
	}
	return nil
}

// e2e times producers enqueueing one job per transaction while a runner
// works them off, and prints the WAL written per job by the whole run.
func (b *bench) e2e(ctx context.Context) (float64, error) {
	from, err := b.wal.mark(ctx)
	if err != nil {
		return 0, err
	}
	stop, err := b.startRunner(ctx, b.claimBatch(100))
	if err != nil {
		return 0, err
	}
	cpuFrom, start := sampleCPU(), time.Now()
	var next atomic.Int64
	errs := make(chan error, b.o.producers)
	var wg sync.WaitGroup
	for range b.o.producers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.o.jobs) {
				if _, err := b.store.Enqueue(ctx, b.pool, jobs.EnqueueParams{Tenant: "bench", Kind: benchKind}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	err = <-errs
	var done time.Time
	if err == nil {
		fmt.Fprintf(b.progress, "llmq bench: all %d jobs enqueued after %.1fs; waiting for the runner\n", b.o.jobs, time.Since(start).Seconds())
		done, err = b.waitDone(ctx)
		b.report.cpu(cpuFrom, sampleCPU(), b.o.jobs)
	}
	elapsed := done.Sub(start).Seconds()
	if stopErr := stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return 0, err
	}
	return elapsed, b.printWAL(ctx, "run", b.o.jobs, from)
}

// latency enqueues at a fixed rate, independent of completions, and reports
// the time from each enqueue call to its handler's start.
func (b *bench) latency(ctx context.Context) (float64, error) {
	stop, err := b.startRunner(ctx, b.claimBatch(10))
	if err != nil {
		return 0, err
	}
	interval := time.Duration(float64(time.Second) / b.o.rate)
	sent := make(map[uuid.UUID]time.Time, b.o.jobs)
	enqueueTook := make([]time.Duration, 0, b.o.jobs)
	var sentMu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	start := time.Now()
	for i := range b.o.jobs {
		at := start.Add(time.Duration(i) * interval)
		if !sleepUntil(ctx, at) {
			break
		}
		wg.Go(func() {
			t0 := time.Now()
			res, err := b.store.Enqueue(ctx, b.pool, jobs.EnqueueParams{Tenant: "bench", Kind: benchKind})
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			took := time.Since(t0)
			sentMu.Lock()
			sent[res.Job.ID] = t0
			enqueueTook = append(enqueueTook, took)
			sentMu.Unlock()
		})
	}
	wg.Wait()
	var done time.Time
	select {
	case err = <-errs:
	default:
		done, err = b.waitDone(ctx)
	}
	elapsed := done.Sub(start).Seconds()
	if stopErr := stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	latencies := make([]time.Duration, 0, len(sent))
	for id, t0 := range sent {
		latencies = append(latencies, b.started[id].Sub(t0))
	}
	b.report.latency(latencyReport{RatePerSecond: b.o.rate, EnqueueToStart: summarize(latencies), EnqueueCall: summarize(enqueueTook)})
	return elapsed, nil
}

// writeOutboxEvents writes n outbox events on 1,000 keys, topic "bench",
// and vacuums the outbox.
func (b *bench) writeOutboxEvents(ctx context.Context, n int) (*outbox.Store, error) {
	events, err := outbox.NewStore(outbox.Config{Schema: b.schema})
	if err != nil {
		return nil, err
	}
	const batch = 1000
	for done := 0; done < n; done += batch {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			for i := done; i < min(done+batch, n); i++ {
				_, err := events.Write(ctx, tx, outbox.Event{
					Topic: "bench", Key: strconv.Itoa(i % 1000), Type: "bench.event",
					Payload: json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`),
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+b.schema+".outbox"); err != nil {
		return nil, err
	}
	return events, nil
}

// checkpoint starts the timed part of a run right after a checkpoint, so
// that every run of a comparison pays the same full-page images and none
// has a checkpoint land in its middle by chance (the backlog's writes fill
// the WAL towards max_wal_size). CHECKPOINT needs a superuser or the
// pg_checkpoint role; without them the run goes on and says so.
func (b *bench) checkpoint(ctx context.Context) {
	if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(b.progress, "llmq bench: no CHECKPOINT before the timed part (%v); a checkpoint may land in the middle of this run\n", err)
	}
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	return retry.Sleep(ctx, max(time.Until(at), 0)) && ctx.Err() == nil
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
