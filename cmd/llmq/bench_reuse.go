package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
)

// How `llmq bench -mode reuse` measures result reuse and coalescing:
//
//   - Two phases, each in a throwaway schema of its own: the jobs with
//     reuse keys, then the same jobs without (the baseline for throughput
//     and WAL).
//   - Each phase starts -producers processes (this binary re-executed, as
//     -mode admission does). Each runs a lease.Runner with its share of
//     -workers handlers, as an application's pods would, and, once all
//     are ready, enqueues its share of -jobs one job per transaction, each
//     drawing a tenant and a key number at random; the runners work while
//     the producers enqueue.
//   - The handler pays a call: it inserts a row into bench_calls (an
//     unlogged table of the phase's schema, so every process's calls are
//     counted and the bookkeeping writes no WAL), holds for -hold like a
//     provider call, and with probability -fail-rate returns a transient
//     error, the call paid all the same.
//   - The parent waits until every job is SUCCEEDED, then stops the
//     processes and counts: calls paid and failed, attempts and those
//     reused, and the probes of jobs_reuse_idx (pg_stat_user_indexes).

// benchReuseChild marks a process started by `llmq bench -mode reuse`; it
// names the phase's schema. benchReuseIndex numbers the process and
// benchReuseKeyed says whether its jobs have reuse keys.
const (
	benchReuseChild = "LLMQ_BENCH_REUSE_SCHEMA"
	benchReuseIndex = "LLMQ_BENCH_REUSE_INDEX"
	benchReuseKeyed = "LLMQ_BENCH_REUSE_KEYED"
)

const (
	benchReuseKind = "bench.reuse"
	// benchReuseMostProcesses bounds -producers: each process holds up to
	// benchReuseConns connections and one more for LISTEN.
	benchReuseMostProcesses = 16
	// benchReuseConns is each process's pool: the runner's claims,
	// completions and heartbeats use at most three (lease's sharedConns
	// and one), the producer one, the handlers' call records the rest.
	benchReuseConns = 5
	// benchReuseDefaultJobs, -Processes and -Hold are the mode's defaults
	// when the flags are not given: 10,000 jobs from 8 processes, as a
	// fleet's pods would send them, each call held as briefly as a fast
	// provider answers.
	benchReuseDefaultJobs      = 10_000
	benchReuseDefaultProcesses = 8
	benchReuseDefaultHold      = 5 * time.Millisecond
	// benchReuseMostFailRate bounds -fail-rate. A job fails for good
	// after benchReuseMaxAttempts failed attempts, which fail at the
	// highest rate for about one job in a million: a run's every job must
	// succeed, and at the default attempts (5) a rate of 0.1 failed a job
	// in a few hundred runs of 300 jobs.
	benchReuseMostFailRate = 0.5
	benchReuseMaxAttempts  = 20
	// claimJobsText is in the text of ClaimJobs and ClaimJobsSkippingLocked
	// alone (the claim_jobs block of jobs/queries.sql): the statements
	// that probe jobs_reuse_idx, which claimCounter counts.
	claimJobsText = "picked AS MATERIALIZED"
)

// benchReuseRetry retries an injected failure after a tenth of a second
// rather than the runner's default two: the run's end is then the queue's
// work, not a last retry's backoff. Coalescing does not depend on it.
var benchReuseRetry = llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second}

// errInjected is the handler's transient failure, returned after the call
// was paid.
var errInjected = errors.New("llmq bench: injected transient failure (the call was paid)")

// reuseReport is what the mode found: its settings and one phase with
// reuse keys, one without.
type reuseReport struct {
	Mode      string       `json:"mode"`
	Jobs      int          `json:"jobs"`
	Keys      int          `json:"keys"`
	Tenants   int          `json:"tenants"`
	Processes int          `json:"processes"`
	Workers   int          `json:"workers"`
	HoldMS    float64      `json:"hold_ms"`
	FailRate  float64      `json:"fail_rate"`
	Phases    []reusePhase `json:"phases"`
}

// reusePhase is one phase's run.
type reusePhase struct {
	Reuse bool `json:"reuse"`
	// LoadAverage is the machine's 1-minute load average before the
	// phase, -1 when /proc/loadavg cannot be read.
	LoadAverage float64 `json:"load_avg_1m"`
	// Seconds runs from the start signal to the last job's success, by
	// the database's clock; EnqueueSeconds to the last process's last
	// enqueue.
	Seconds        float64 `json:"seconds"`
	JobsPerSecond  float64 `json:"jobs_per_s"`
	EnqueueSeconds float64 `json:"enqueue_s"`
	Succeeded      int     `json:"succeeded"`
	// WrongResults counts jobs SUCCEEDED with a result that is not their
	// own tenant's answer to their own key: must be 0.
	WrongResults int `json:"wrong_results"`
	// Answers is how many different answers (tenant and key number) the
	// jobs asked for: at most -keys times -tenants.
	Answers          int `json:"answers"`
	PaidCalls        int `json:"paid_calls"`
	InjectedFailures int `json:"injected_failures"`
	// MostPaidCalls is what reuse may pay: a call per answer and one more
	// per injected failure.
	MostPaidCalls int `json:"most_paid_calls"`
	ReusedJobs    int `json:"reused_jobs"`
	Attempts      int `json:"attempts"`
	// ClaimStatements counts the runners' ClaimJobs statements (-1 when
	// none was recognised), IndexProbes the scans of jobs_reuse_idx.
	ClaimStatements         int64     `json:"claim_statements"`
	IndexProbes             int64     `json:"reuse_index_probes"`
	ProbesPerAttempt        float64   `json:"probes_per_attempt"`
	ProbesPerClaimStatement float64   `json:"probes_per_claim_statement"`
	Unrecorded              int64     `json:"unrecorded_outcomes"`
	WAL                     []walLine `json:"wal"`
}

// reuseShare is what one process reports when it stops.
type reuseShare struct {
	EnqueueEnd      time.Time `json:"enqueue_end"`
	ClaimStatements int64     `json:"claim_statements"`
	Unrecorded      int64     `json:"unrecorded_outcomes"`
}

// reuseDefaults sets -jobs, -producers and -hold to the mode's defaults
// when they were not given.
func reuseDefaults(fs *flag.FlagSet, o *benchOptions) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["jobs"] {
		o.jobs = benchReuseDefaultJobs
	}
	if !given["producers"] {
		o.producers = benchReuseDefaultProcesses
	}
	if !given["hold"] {
		o.hold = benchReuseDefaultHold
	}
}

// checkReuseFlags refuses flags the mode cannot honour, naming the flag.
func checkReuseFlags(o benchOptions) error {
	switch {
	case o.jobs < 1 || o.keys < 1 || o.tenants < 1:
		return fmt.Errorf("%w: -jobs, -keys and -tenants must be positive", errUsage)
	case o.producers < 1 || o.producers > benchReuseMostProcesses:
		return fmt.Errorf("%w: -producers %d: use 1 to %d processes with -mode reuse (each holds up to %d connections)", errUsage, o.producers, benchReuseMostProcesses, benchReuseConns+1)
	case o.jobs < o.producers || o.workers < o.producers:
		return fmt.Errorf("%w: -jobs %d and -workers %d: use at least one of each per process (-producers %d)", errUsage, o.jobs, o.workers, o.producers)
	case !(o.failRate >= 0 && o.failRate <= benchReuseMostFailRate): // so that NaN is refused too
		return fmt.Errorf("%w: -fail-rate %g: use 0 to %g (a job fails for good after %d failed attempts)", errUsage, o.failRate, benchReuseMostFailRate, benchReuseMaxAttempts)
	case o.hold < 0 || o.hold > 10*time.Second:
		return fmt.Errorf("%w: -hold %s: use 0 to 10s with -mode reuse", errUsage, o.hold)
	case o.batch < 0 || o.batch > jobs.MaxBatch:
		return fmt.Errorf("%w: -claim-batch %d: use 1 to %d, or 0 for each process's handlers", errUsage, o.batch, jobs.MaxBatch)
	case o.walDetail && !o.walRecords:
		return fmt.Errorf("%w: -wal-detail needs the WAL records that -wal-records=false skips", errUsage)
	}
	return nil
}

// runBenchReuse runs -mode reuse, or one of its processes.
func runBenchReuse(ctx context.Context, c *common, o benchOptions, stdout, stderr io.Writer) error {
	if schema := os.Getenv(benchReuseChild); schema != "" {
		return benchReuseWorker(ctx, c, o, schema, os.Getenv(benchReuseKeyed) == "true", os.Stdin, stdout, stderr)
	}
	if err := checkReuseFlags(o); err != nil {
		return err
	}
	pool, err := c.connectBench(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	progress := &lockedWriter{w: stderr}
	fmt.Fprintf(progress, "llmq bench: mode=reuse jobs=%d keys=%d tenants=%d processes=%d workers=%d hold=%s fail_rate=%g\n",
		o.jobs, o.keys, o.tenants, o.producers, o.workers, o.hold, o.failRate)
	r := &reuseReport{Mode: o.mode, Jobs: o.jobs, Keys: o.keys, Tenants: o.tenants, Processes: o.producers, Workers: o.workers,
		HoldMS: float64(o.hold.Microseconds()) / 1000, FailRate: o.failRate}
	for _, keyed := range []bool{true, false} {
		run := &reuseRun{c: c, o: o, pool: pool, self: self, progress: progress, keyed: keyed}
		p, err := run.phase(ctx)
		if err != nil {
			return err
		}
		r.Phases = append(r.Phases, p)
	}
	if err := r.print(c.json, stdout); err != nil {
		return err
	}
	return r.check()
}

// reuseRun is one phase: its schema and its processes.
type reuseRun struct {
	c        *common
	o        benchOptions
	pool     *pgxpool.Pool
	self     string
	progress io.Writer
	keyed    bool
	schema   string
	children []benchChild
	// events carries what the processes' output says while the phase
	// runs (watchChildren).
	events chan childEvent
	// appPrefix starts the application_name of every connection of the
	// phase's processes.
	appPrefix string
}

// name is the phase's name in progress and WAL lines.
func (r *reuseRun) name() string {
	if r.keyed {
		return "reuse"
	}
	return "no-reuse"
}

// phase runs the phase in a throwaway schema and returns its figures.
func (r *reuseRun) phase(ctx context.Context) (reusePhase, error) {
	p := reusePhase{Reuse: r.keyed, LoadAverage: loadAverage()}
	schema, drop, err := throwawaySchema(ctx, r.pool, r.o.keep, r.progress)
	if err != nil {
		return p, err
	}
	defer drop()
	r.schema, r.appPrefix = schema, schema+"-reuse-"
	// Unlogged: the bench's bookkeeping writes no WAL, so the WAL per job
	// is the queue's alone.
	_, err = r.pool.Exec(ctx, "CREATE UNLOGGED TABLE "+schema+".bench_calls (job_id uuid NOT NULL, attempt integer NOT NULL, failed boolean NOT NULL)")
	if err != nil {
		return p, fmt.Errorf("llmq bench: creating the calls table: %w", err)
	}
	wal := newWALMeter(ctx, r.pool, schema, r.o.walRecords, r.progress)
	wal.perRelation = r.o.walDetail
	defer wal.close(ctx)
	defer r.kill()
	if err := r.startChildren(ctx); err != nil {
		return p, err
	}
	fmt.Fprintf(r.progress, "llmq bench: %s: %d processes ready (schema %s, load average %.2f); starting\n", r.name(), len(r.children), schema, p.LoadAverage)
	if err := r.timed(ctx, wal, &p); err != nil {
		return p, err
	}
	err = r.count(ctx, &p)
	return p, err
}

// timed starts the processes' work, waits until every job succeeded, and
// stops them: the phase's time, WAL and each process's figures.
func (r *reuseRun) timed(ctx context.Context, wal *walMeter, p *reusePhase) error {
	(&bench{pool: r.pool, progress: r.progress}).checkpoint(ctx)
	from, err := wal.mark(ctx)
	if err != nil {
		return err
	}
	var start time.Time
	if err := r.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		return err
	}
	startedAt := time.Now()
	if err := r.signalStart(); err != nil {
		return err
	}
	r.watchChildren()
	end, err := r.waitDone(ctx)
	if err != nil {
		return err
	}
	p.Seconds = end.Sub(start).Seconds()
	p.JobsPerSecond = float64(r.o.jobs) / p.Seconds
	measured, err := wal.measure(ctx, from, r.progress)
	if err != nil {
		return err
	}
	p.WAL = measured.lines(r.name(), r.o.jobs)
	shares, err := r.stopChildren(ctx)
	if err != nil {
		return err
	}
	for _, s := range shares {
		p.EnqueueSeconds = max(p.EnqueueSeconds, s.EnqueueEnd.Sub(startedAt).Seconds())
		p.ClaimStatements += s.ClaimStatements
		p.Unrecorded += s.Unrecorded
	}
	return nil
}

// startChildren starts the phase's processes, each with its share of the
// jobs and handlers, and waits until every one is ready.
func (r *reuseRun) startChildren(ctx context.Context) error {
	r.children = make([]benchChild, r.o.producers)
	for i := range r.children {
		ch, err := r.startChild(ctx, i)
		if err != nil {
			return err
		}
		r.children[i] = ch
	}
	for i := range r.children {
		if line, err := r.children[i].out.ReadString('\n'); err != nil || line != "ready\n" {
			return r.children[i].failure(i, fmt.Errorf("it did not start (it said %q): %w", line, cmp.Or(err, errors.New("expected \"ready\""))))
		}
	}
	return nil
}

// startChild starts process i with its share of -jobs and -workers.
func (r *reuseRun) startChild(ctx context.Context, i int) (benchChild, error) {
	share := func(n int) string {
		s := n / r.o.producers
		if i < n%r.o.producers {
			s++
		}
		return strconv.Itoa(s)
	}
	cmd := exec.CommandContext(ctx, r.self, "bench", "-mode", "reuse", "-database-url", r.c.databaseURL,
		"-jobs", share(r.o.jobs), "-workers", share(r.o.workers), "-keys", strconv.Itoa(r.o.keys), "-tenants", strconv.Itoa(r.o.tenants),
		"-fail-rate", strconv.FormatFloat(r.o.failRate, 'g', -1, 64), "-hold", r.o.hold.String(),
		"-claim-batch", strconv.Itoa(r.o.batch), "-notify-interval", r.o.notifyEach.String())
	cmd.Env = append(os.Environ(), benchReuseChild+"="+r.schema, benchReuseIndex+"="+strconv.Itoa(i), benchReuseKeyed+"="+strconv.FormatBool(r.keyed))
	tail := &tailBuffer{max: 4096}
	cmd.Stderr = io.MultiWriter(r.progress, tail)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return benchChild{}, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return benchChild{}, err
	}
	if err := cmd.Start(); err != nil {
		return benchChild{}, fmt.Errorf("starting bench process %d: %w", i, err)
	}
	return benchChild{cmd: cmd, stdin: stdin, out: bufio.NewReader(out), stderr: tail}, nil
}

// signalStart tells every process to start enqueueing.
func (r *reuseRun) signalStart() error {
	for i, ch := range r.children {
		if _, err := io.WriteString(ch.stdin, "go\n"); err != nil {
			return r.children[i].failure(i, fmt.Errorf("sending the start signal: %w", err))
		}
	}
	return nil
}

// childEvent is what a process's output said: that its share is
// enqueued, or, after that, that it wrote again or ended (err).
type childEvent struct {
	process  int
	enqueued bool
	err      error
}

// watchChildren reads each process's output while the phase runs: its
// "enqueued", then nothing until it is told to stop and writes its
// figures. Output that ends before then is a process that died, which
// the phase hears at once; its leased jobs would otherwise hold the
// others up until their leases expired.
func (r *reuseRun) watchChildren() {
	r.events = make(chan childEvent, 2*len(r.children))
	for i := range r.children {
		out := r.children[i].out
		go func() {
			line, err := out.ReadString('\n')
			if err == nil && line != "enqueued\n" {
				err = fmt.Errorf("it said %q, not \"enqueued\"", line)
			}
			if err != nil {
				r.events <- childEvent{process: i, err: err}
				return
			}
			r.events <- childEvent{process: i, enqueued: true}
			_, err = out.Peek(1)
			r.events <- childEvent{process: i, err: err}
		}()
	}
}

// reuseProgress is one look at the phase's jobs and calls.
type reuseProgress struct {
	jobs, succeeded, failed, paid, paidFailed int
	lastSuccess                               *time.Time
}

// waitDone waits until every process has enqueued its share and every job
// is SUCCEEDED, saying how far it got each second, and returns the
// database's time of the last success. A job that ended otherwise, a
// process that failed, or a minute without a job finishing ends the wait
// with the reason.
func (r *reuseRun) waitDone(ctx context.Context) (time.Time, error) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	enqueueing := len(r.children)
	lastReport, lastChange := time.Now(), time.Now()
	var last reuseProgress
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case e := <-r.events:
			if !e.enqueued {
				// Waited for here, so its exit status and last words are
				// all in the message.
				return time.Time{}, r.children[e.process].failure(e.process, fmt.Errorf("while the jobs ran: %w", cmp.Or(e.err, errors.New("it wrote before it was told to stop"))))
			}
			enqueueing--
			continue
		case <-tick.C:
		}
		now, err := r.look(ctx)
		switch {
		case err != nil:
			return time.Time{}, err
		case now.failed > 0:
			return time.Time{}, r.notSucceeded(ctx)
		case enqueueing == 0 && now.succeeded >= r.o.jobs:
			return *now.lastSuccess, nil
		}
		if now.jobs != last.jobs || now.succeeded != last.succeeded {
			last, lastChange = now, time.Now()
		} else if time.Since(lastChange) >= benchStall {
			return time.Time{}, r.stalled(ctx, now)
		}
		if time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(r.progress, "llmq bench: %s: %d of %d jobs enqueued, %d SUCCEEDED, %d calls paid (%d failed)\n",
				r.name(), now.jobs, r.o.jobs, now.succeeded, now.paid, now.paidFailed)
		}
	}
}

// look reads the phase's progress. It reads the jobs table without a
// reuse key in its conditions, so it never scans jobs_reuse_idx, whose
// scans the phase counts.
func (r *reuseRun) look(ctx context.Context) (reuseProgress, error) {
	var p reuseProgress
	err := r.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'SUCCEEDED'),
			count(*) FILTER (WHERE state IN ('REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')),
			max(finished_at) FILTER (WHERE state = 'SUCCEEDED'),
			(SELECT count(*) FROM `+r.schema+`.bench_calls), (SELECT count(*) FROM `+r.schema+`.bench_calls WHERE failed)
		FROM `+r.schema+`.jobs`).Scan(&p.jobs, &p.succeeded, &p.failed, &p.lastSuccess, &p.paid, &p.paidFailed)
	if err != nil {
		return p, fmt.Errorf("llmq bench: reading the jobs' progress: %w", err)
	}
	return p, nil
}

// notSucceeded says which job ended other than SUCCEEDED, and why.
func (r *reuseRun) notSucceeded(ctx context.Context) error {
	var (
		id           string
		state, cause string
	)
	err := r.pool.QueryRow(ctx, `SELECT id::text, state, coalesce(last_error, '') FROM `+r.schema+`.jobs
		WHERE state IN ('REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED') LIMIT 1`).Scan(&id, &state, &cause)
	if err != nil {
		return fmt.Errorf("llmq bench: a job ended other than SUCCEEDED; reading which: %w", err)
	}
	return fmt.Errorf("llmq bench: %s: job %s ended %s, not SUCCEEDED: %s", r.name(), id, state, cause)
}

// stalled explains a phase in which no job finished for benchStall: how
// many jobs are in each state.
func (r *reuseRun) stalled(ctx context.Context, now reuseProgress) error {
	rows, err := r.pool.Query(ctx, "SELECT state || ' ' || count(*) FROM "+r.schema+".jobs GROUP BY state ORDER BY state")
	var states []string
	if err == nil {
		states, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		states = []string{fmt.Sprintf("unreadable: %v", err)}
	}
	return fmt.Errorf("llmq bench: %s: no job finished for %s: %d of %d jobs enqueued, %d SUCCEEDED; by state: %s",
		r.name(), benchStall, now.jobs, r.o.jobs, now.succeeded, strings.Join(states, ", "))
}

// stopChildren closes every process's stdin, which stops its runner, and
// reads its figures as each arrives. The statistics its connections kept
// reach pg_stat_user_indexes as they close.
func (r *reuseRun) stopChildren(ctx context.Context) ([]reuseShare, error) {
	for _, ch := range r.children {
		_ = ch.stdin.Close()
	}
	// A runner stops within its ShutdownGrace (10s) once its handlers
	// are done, and every job is done by now.
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	shares := make([]reuseShare, len(r.children))
	for range r.children {
		var e childEvent
		select {
		case e = <-r.events:
		case <-timeout.C:
			return nil, errors.New("llmq bench: a bench process did not report its figures within a minute of being told to stop")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		ch := &r.children[e.process]
		err := e.err
		if err == nil {
			err = json.NewDecoder(ch.out).Decode(&shares[e.process])
		}
		if err != nil {
			return nil, ch.failure(e.process, fmt.Errorf("reading its figures: %w", err))
		}
		if err := ch.cmd.Wait(); err != nil {
			ch.cmd = nil
			return nil, fmt.Errorf("bench process %d: %w; its last output:\n%s", e.process, err, ch.stderr.String())
		}
		ch.cmd = nil
	}
	return shares, nil
}

// kill ends the processes still running (the phase failed).
func (r *reuseRun) kill() {
	for _, ch := range r.children {
		if ch.cmd != nil {
			_ = ch.cmd.Process.Kill()
			_ = ch.cmd.Wait()
		}
	}
}

// count reads, once the processes are gone, the index probes and what
// became of the jobs and calls.
func (r *reuseRun) count(ctx context.Context, p *reusePhase) error {
	probes, err := r.probes(ctx)
	if err != nil {
		return err
	}
	p.IndexProbes = probes
	err = r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'SUCCEEDED'),
			count(*) FILTER (WHERE state = 'SUCCEEDED' AND (result->>'tenant' IS DISTINCT FROM tenant OR result->'n' IS DISTINCT FROM payload->'n')),
			count(DISTINCT (tenant, payload->>'n')),
			(SELECT count(*) FROM `+r.schema+`.bench_calls), (SELECT count(*) FROM `+r.schema+`.bench_calls WHERE failed),
			(SELECT count(*) FROM `+r.schema+`.job_attempts), (SELECT count(*) FROM `+r.schema+`.job_attempts WHERE outcome = $1)
		FROM `+r.schema+`.jobs`, string(jobs.AttemptReused)).Scan(
		&p.Succeeded, &p.WrongResults, &p.Answers, &p.PaidCalls, &p.InjectedFailures, &p.Attempts, &p.ReusedJobs)
	if err != nil {
		return fmt.Errorf("llmq bench: counting the jobs, calls and attempts: %w", err)
	}
	p.MostPaidCalls = p.Answers + p.InjectedFailures
	if p.Attempts > 0 {
		p.ProbesPerAttempt = float64(p.IndexProbes) / float64(p.Attempts)
	}
	if p.ClaimStatements > 0 {
		p.ProbesPerClaimStatement = float64(p.IndexProbes) / float64(p.ClaimStatements)
	} else {
		p.ClaimStatements = -1 // the claim's text changed: see claimJobsText
	}
	return nil
}

// probes reads how often jobs_reuse_idx was scanned in the phase's schema
// (a fresh schema: from zero). A backend publishes its counts to the
// cumulative statistics when it ends, before it leaves pg_stat_activity;
// until then (PostgreSQL 15) it publishes at most once a second, and an
// idle one up to 10 s late. So the count is read once no connection of
// the phase's processes is left. Each statement here is a transaction of
// its own, so no earlier reading is served from the statistics snapshot
// (stats_fetch_consistency).
func (r *reuseRun) probes(ctx context.Context) (int64, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left int
		if err := r.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1)", r.appPrefix).Scan(&left); err != nil {
			return 0, fmt.Errorf("llmq bench: waiting for the processes' connections to close: %w", err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("llmq bench: %d connections of the bench processes still open 30s after they exited: their index statistics are not all published", left)
		}
		if !sleepUntil(ctx, time.Now().Add(20*time.Millisecond)) {
			return 0, ctx.Err()
		}
	}
	var n int64
	err := r.pool.QueryRow(ctx, "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes WHERE schemaname = $1 AND indexrelname = 'jobs_reuse_idx'", r.schema).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("llmq bench: reading the scans of jobs_reuse_idx: %w", err)
	}
	return n, nil
}

// print writes the report: the settings, a table with a column per phase,
// the WAL lines and the summary line last; with -json, one JSON object.
func (r *reuseReport) print(asJSON bool, out io.Writer) error {
	if asJSON {
		return json.NewEncoder(out).Encode(r)
	}
	fmt.Fprintf(out, "llmq reuse: jobs=%d keys=%d tenants=%d processes=%d workers=%d hold_ms=%g fail_rate=%g\n",
		r.Jobs, r.Keys, r.Tenants, r.Processes, r.Workers, r.HoldMS, r.FailRate)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "phase")
	for _, p := range r.Phases {
		title := "without reuse"
		if p.Reuse {
			title = "with reuse"
		}
		fmt.Fprintf(tw, "\t%s", title)
	}
	fmt.Fprintln(tw)
	for _, row := range reuseRows(r.Jobs) {
		fmt.Fprint(tw, row.name)
		for _, p := range r.Phases {
			fmt.Fprintf(tw, "\t%s", row.value(p))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range r.Phases {
		for _, w := range p.WAL {
			w.print(out)
		}
	}
	return r.printSummary(out)
}

// reuseRow is one line of the table.
type reuseRow struct {
	name  string
	value func(reusePhase) string
}

// reuseRows are the table's lines, for total jobs.
func reuseRows(total int) []reuseRow {
	d := strconv.Itoa
	return []reuseRow{
		{"load average before", func(p reusePhase) string { return fmt.Sprintf("%.2f", p.LoadAverage) }},
		{"seconds, start to last success", func(p reusePhase) string { return fmt.Sprintf("%.3f", p.Seconds) }},
		{"jobs/s", func(p reusePhase) string { return fmt.Sprintf("%.0f", p.JobsPerSecond) }},
		{"seconds, start to last enqueue", func(p reusePhase) string { return fmt.Sprintf("%.3f", p.EnqueueSeconds) }},
		{"jobs SUCCEEDED", func(p reusePhase) string { return fmt.Sprintf("%d of %d", p.Succeeded, total) }},
		{"answers asked for (tenant, key)", func(p reusePhase) string { return d(p.Answers) }},
		{"paid calls", func(p reusePhase) string { return d(p.PaidCalls) }},
		{"of which injected failures", func(p reusePhase) string { return d(p.InjectedFailures) }},
		{"most paid calls allowed", func(p reusePhase) string {
			if !p.Reuse {
				return "-"
			}
			return fmt.Sprintf("%d (answers + failures)", p.MostPaidCalls)
		}},
		{"jobs reused", func(p reusePhase) string { return d(p.ReusedJobs) }},
		{"attempts (claimed jobs)", func(p reusePhase) string { return d(p.Attempts) }},
		{"ClaimJobs statements", func(p reusePhase) string { return strconv.FormatInt(p.ClaimStatements, 10) }},
		{"jobs_reuse_idx probes", func(p reusePhase) string { return strconv.FormatInt(p.IndexProbes, 10) }},
		{"probes per attempt", func(p reusePhase) string { return fmt.Sprintf("%.2f", p.ProbesPerAttempt) }},
		{"probes per ClaimJobs statement", func(p reusePhase) string { return fmt.Sprintf("%.2f", p.ProbesPerClaimStatement) }},
		{"WAL per job", func(p reusePhase) string { return walPerJob(p.WAL) }},
		{"outcomes not recorded", func(p reusePhase) string { return strconv.FormatInt(p.Unrecorded, 10) }},
		{"results not the job's own answer", func(p reusePhase) string { return d(p.WrongResults) }},
	}
}

// walPerJob is a phase's WAL per job: the total, and the schema's own
// when the records were read.
func walPerJob(lines []walLine) string {
	for _, w := range lines {
		if w.Relation != "" {
			continue
		}
		if w.walRecordsPerJob == nil {
			return fmt.Sprintf("%.0f B", w.BytesPerJob)
		}
		return fmt.Sprintf("%.0f B (schema's own %.0f B)", w.BytesPerJob, w.SchemaBytes)
	}
	return "-"
}

// printSummary writes the last line: the reuse phase's counts and both
// phases' rate and WAL.
func (r *reuseReport) printSummary(out io.Writer) error {
	var with, without reusePhase
	for _, p := range r.Phases {
		if p.Reuse {
			with = p
		} else {
			without = p
		}
	}
	wal := func(p reusePhase) float64 {
		if len(p.WAL) == 0 {
			return math.NaN()
		}
		return p.WAL[0].BytesPerJob
	}
	_, err := fmt.Fprintf(out, "llmq reuse jobs=%d keys=%d answers=%d paid_calls=%d most_paid_calls=%d injected_failures=%d reused_jobs=%d "+
		"probes_per_attempt=%.2f probes_per_claim_statement=%.2f jobs_per_s=%.0f no_reuse_jobs_per_s=%.0f wal_bytes_per_job=%.0f no_reuse_wal_bytes_per_job=%.0f\n",
		r.Jobs, r.Keys, with.Answers, with.PaidCalls, with.MostPaidCalls, with.InjectedFailures, with.ReusedJobs,
		with.ProbesPerAttempt, with.ProbesPerClaimStatement, with.JobsPerSecond, without.JobsPerSecond, wal(with), wal(without))
	return err
}

// check fails the bench when a job did not succeed with its own answer, or
// reuse paid more calls than one per answer and one per injected failure.
func (r *reuseReport) check() error {
	var errs []error
	for _, p := range r.Phases {
		if p.Succeeded != r.Jobs {
			errs = append(errs, fmt.Errorf("llmq bench: reuse=%t: %d of %d jobs SUCCEEDED", p.Reuse, p.Succeeded, r.Jobs))
		}
		if p.WrongResults > 0 {
			errs = append(errs, fmt.Errorf("llmq bench: reuse=%t: %d jobs SUCCEEDED with a result that is not their own tenant's answer to their key", p.Reuse, p.WrongResults))
		}
		if p.Reuse && p.PaidCalls > p.MostPaidCalls {
			errs = append(errs, fmt.Errorf("llmq bench: reuse paid %d calls for %d answers (of %d keys, %d tenants) and %d injected failures: more than one call was paid for an answer",
				p.PaidCalls, p.Answers, r.Keys, r.Tenants, p.InjectedFailures))
		}
	}
	return errors.Join(errs...)
}

// benchReuseWorker is one process of the bench: a runner with its share
// of -workers handlers, running from the start, and a producer that
// enqueues its share of -jobs once told to (a line on stdin). It says
// "ready" once connected and "enqueued" once its share is in, and when
// its stdin closes it stops its runner and reports its figures as JSON.
func benchReuseWorker(ctx context.Context, c *common, o benchOptions, schema string, keyed bool, in io.Reader, stdout, stderr io.Writer) error {
	claims := &claimCounter{}
	pool, err := connectReuseWorker(ctx, c.databaseURL, schema+"-reuse-"+os.Getenv(benchReuseIndex), claims)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := jobs.NewStore(jobs.Config{Schema: schema, NotifyInterval: o.notifyEach})
	if err != nil {
		return err
	}
	w := &reuseWorker{o: o, pool: pool, progress: stderr, pay: "INSERT INTO " + schema + ".bench_calls (job_id, attempt, failed) VALUES ($1, $2, $3)"}
	stop, err := w.startRunner(ctx, store)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ready")
	lines := bufio.NewReader(in)
	if _, err := lines.ReadString('\n'); err != nil {
		return errors.Join(fmt.Errorf("bench process: no start signal: %w", err), stop())
	}
	if err := w.enqueue(ctx, store, keyed); err != nil {
		return errors.Join(err, stop())
	}
	share := reuseShare{EnqueueEnd: time.Now()}
	fmt.Fprintln(stdout, "enqueued")
	_, _ = io.Copy(io.Discard, lines) // the parent closes stdin once every job succeeded
	if err := stop(); err != nil {
		return err
	}
	share.ClaimStatements, share.Unrecorded = claims.n.Load(), w.unrecorded.Load()
	return json.NewEncoder(stdout).Encode(share)
}

// connectReuseWorker opens a process's pool, its connections named app in
// pg_stat_activity and traced by claims, and connects it.
func connectReuseWorker(ctx context.Context, url, app string, claims *claimCounter) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = benchReuseConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.Tracer = claims
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("bench process: connecting: %w", err)
	}
	return pool, nil
}

// reuseWorker is a bench process's handler and producer.
type reuseWorker struct {
	o          benchOptions
	pool       *pgxpool.Pool
	progress   io.Writer
	pay        string // records a paid call
	unrecorded atomic.Int64
	saidOnce   atomic.Bool
}

// reuseAnswer is a job's result: its tenant's answer to its key number.
type reuseAnswer struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

// startRunner runs the process's runner until the returned stop is called.
func (w *reuseWorker) startRunner(ctx context.Context, store *jobs.PostgresStore) (stop func() error, err error) {
	r, err := lease.NewRunner(w.pool, store, lease.Config{
		Handlers:    map[string]lease.Handler{benchReuseKind: lease.HandlerFunc(w.call)},
		Queues:      map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: w.o.workers}},
		ClaimBatch:  min(cmp.Or(w.o.batch, w.o.workers), jobs.MaxBatch),
		Retry:       benchReuseRetry,
		AfterRecord: w.afterRecord,
		Logger:      slog.New(slog.NewTextHandler(w.progress, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return nil, err
	}
	return runInBackground(ctx, r), nil
}

// enqueue enqueues the process's share, one job per transaction, each of a
// tenant and key number drawn at random: the key is jobs.ReuseKey of the
// number, and each tenant's keys are its own (Reuse.Shared is false).
func (w *reuseWorker) enqueue(ctx context.Context, store *jobs.PostgresStore, keyed bool) error {
	keys := make([]string, w.o.keys)
	for n := range keys {
		key, err := jobs.ReuseKey(n)
		if err != nil {
			return err
		}
		keys[n] = key
	}
	tenants := &bench{o: w.o}
	for range w.o.jobs {
		n := rand.IntN(len(keys))
		p := jobs.EnqueueParams{Tenant: tenants.tenant(rand.IntN(w.o.tenants)), Kind: benchReuseKind, Payload: json.RawMessage(`{"n":` + strconv.Itoa(n) + `}`),
			MaxAttempts: benchReuseMaxAttempts}
		if keyed {
			p.Reuse = &jobs.Reuse{Key: keys[n]}
		}
		if _, err := store.Enqueue(ctx, w.pool, p); err != nil {
			return fmt.Errorf("bench process: enqueueing: %w", err)
		}
	}
	return nil
}

// call pays for one call: it records the call, holds like a provider call
// and fails with probability -fail-rate, or answers. A call it could not
// record fails its job for good, so the bench stops and says so rather
// than count a call short.
func (w *reuseWorker) call(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
	var in struct {
		N int `json:"n"`
	}
	if err := json.Unmarshal(job.Payload, &in); err != nil {
		return nil, jobs.Permanent(fmt.Errorf("llmq bench: reading the payload: %w", err))
	}
	failed := rand.Float64() < w.o.failRate
	if _, err := w.pool.Exec(ctx, w.pay, job.ID, job.Attempt, failed); err != nil {
		return nil, jobs.Permanent(fmt.Errorf("llmq bench: recording the paid call: %w", err))
	}
	if !sleepUntil(ctx, time.Now().Add(w.o.hold)) {
		return nil, context.Cause(ctx)
	}
	if failed {
		return nil, errInjected
	}
	return json.Marshal(reuseAnswer{Tenant: job.Tenant, N: in.N})
}

// afterRecord counts the outcomes the runner could not record (a lost
// lease, a failed commit), and says the first on the progress output: its
// job comes back through the reaper.
func (w *reuseWorker) afterRecord(_ *jobs.Job, err error) {
	if err == nil {
		return
	}
	w.unrecorded.Add(1)
	if w.saidOnce.CompareAndSwap(false, true) {
		fmt.Fprintf(w.progress, "llmq bench: an outcome was not recorded (its job comes back after its lease expires): %v\n", err)
	}
}

// claimCounter counts the ClaimJobs statements sent on a pool, which the
// store queues in a batch: the statements that probe jobs_reuse_idx. It
// recognises them by their text (claimJobsText).
type claimCounter struct{ n atomic.Int64 }

func (t *claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *claimCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *claimCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t *claimCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, claimJobsText) {
		t.n.Add(1)
	}
}

func (t *claimCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
