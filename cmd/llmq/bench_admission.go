package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/admission"
)

// benchAdmissionChild marks a process started by `llmq bench -mode
// admission` to acquire and release permits; it names the schema.
const benchAdmissionChild = "LLMQ_BENCH_ADMISSION_SCHEMA"

// benchAdmissionApp prefixes the application_name of each bench process's
// connections (…-0, …-1, …), by which the parent counts them.
const benchAdmissionApp = "llmq-bench-admission"

// benchAdmissionPool has limits no grant reaches, so the bench measures the
// limiter itself: every acquire is granted, all on one hot pool row.
var benchAdmissionPool = admission.Pool{Name: "bench", RPM: 1 << 30, TPM: 1 << 50, MaxInFlight: 1 << 30}

// admissionShare is what one process reports.
type admissionShare struct {
	Grants      int       `json:"grants"`
	Denials     int       `json:"denials"`
	Unavailable int       `json:"unavailable"`
	FirstError  string    `json:"first_error,omitempty"` // the first unavailable, for the report
	AcquireMS   []float64 `json:"acquire_ms"`
	GrantedAtUS []int64   `json:"granted_at_us"` // when each grant returned, Unix µs
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	// CPU is what the process used (user and system) from Start to End,
	// from /proc; negative when that cannot be read.
	CPU time.Duration `json:"cpu_ns"`
	// Allocs is the heap allocations the process made from Start to End,
	// and RoundTrips what its limiter sent: each batch (a cycle) and each
	// query outside one is one round trip.
	Allocs     uint64 `json:"allocs"`
	RoundTrips int64  `json:"round_trips"`
}

// benchChild is one bench process as the parent sees it.
type benchChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *tailBuffer
}

// failure explains why child i stopped answering: its exit status and the
// last lines it wrote to stderr.
func (ch *benchChild) failure(i int, err error) error {
	waitErr := ch.cmd.Wait()
	ch.cmd = nil
	return fmt.Errorf("bench process %d (of -producers) failed: %w; its last output:\n%s", i, errors.Join(err, waitErr), ch.stderr.String())
}

// runBenchAdmission measures acquire+release on one hot pool of the
// Postgres limiter from o.producers processes with o.workers goroutines
// each, o.jobs grants in all.
func runBenchAdmission(ctx context.Context, c *common, o benchOptions, stdout, stderr io.Writer) error {
	if schema := os.Getenv(benchAdmissionChild); schema != "" {
		return benchAdmissionWorker(ctx, c, o, schema, os.Stdin, stdout)
	}
	if o.jobs < 1 || o.workers < 1 || o.producers < 1 || o.arrivals < 0 || o.hold < 0 {
		return fmt.Errorf("%w: -jobs, -workers and -producers must be positive, -arrivals and -hold not negative", errUsage)
	}
	pool, err := pgxpool.New(ctx, c.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema, drop, err := throwawaySchema(ctx, pool, o.keep, stderr)
	if err != nil {
		return err
	}
	defer drop()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := l.SetPool(ctx, benchAdmissionPool); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "llmq bench: mode=admission processes=%d workers=%d grants=%d load=%q process_gomaxprocs=%s schema=%s\n",
		o.producers, o.workers, o.jobs, admissionLoad(o), gomaxprocsLabel(childGOMAXPROCS(o.producers)), schema)
	if o.cpuProfile != "" {
		fmt.Fprintf(stderr, "llmq bench: each process profiles its measured phase into %s.<process>, 0 to %d\n", o.cpuProfile, o.producers-1)
	}

	children := make([]benchChild, o.producers)
	defer func() {
		for _, ch := range children {
			if ch.cmd != nil {
				_ = ch.cmd.Process.Kill()
				_ = ch.cmd.Wait()
			}
		}
	}()
	for i := range children {
		share := o.jobs / o.producers
		if i < o.jobs%o.producers {
			share++
		}
		cmd := exec.CommandContext(ctx, self, "bench", "-mode", "admission", "-database-url", c.databaseURL,
			"-jobs", strconv.Itoa(max(share, 1)), "-workers", strconv.Itoa(o.workers),
			"-arrivals", strconv.FormatFloat(o.arrivals/float64(o.producers), 'f', -1, 64), "-hold", o.hold.String())
		if o.cpuProfile != "" {
			// Each process profiles its own measured phase: the parent only
			// waits, so its profile would say nothing.
			cmd.Args = append(cmd.Args, "-cpuprofile", fmt.Sprintf("%s.%d", o.cpuProfile, i))
		}
		cmd.Env = append(os.Environ(), benchAdmissionChild+"="+schema, fmt.Sprintf("PGAPPNAME=%s-%d", benchAdmissionApp, i))
		if procs := childGOMAXPROCS(o.producers); procs > 0 {
			cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(procs))
		}
		tail := &tailBuffer{max: 4096}
		cmd.Stderr = io.MultiWriter(stderr, tail)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		children[i] = benchChild{cmd: cmd, stdin: stdin, out: bufio.NewReader(out), stderr: tail}
	}
	// Start together: every process connects first, then all are told to go.
	for i := range children {
		if line, err := children[i].out.ReadString('\n'); err != nil || line != "ready\n" {
			return children[i].failure(i, fmt.Errorf("it did not start (it said %q): %w", line, errors.Join(err, errors.New("expected \"ready\""))))
		}
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	peaks := sampleConnections(sampleCtx, pool)
	cpuBefore, serverBefore := readMachineCPU(), sampleCPU()
	for _, ch := range children {
		_ = ch.stdin.Close()
	}
	shares := make([]admissionShare, len(children))
	for i := range children {
		if err := json.NewDecoder(children[i].out).Decode(&shares[i]); err != nil {
			stopSampling()
			return children[i].failure(i, fmt.Errorf("reading its figures: %w", err))
		}
	}
	machine, serverAfter := readMachineCPU().since(cpuBefore), sampleCPU()
	stopSampling()
	peak := <-peaks
	for i := range children {
		// Their connections' statistics reach pg_stat_user_tables when
		// they close.
		if err := children[i].cmd.Wait(); err != nil {
			return fmt.Errorf("bench process %d: %w; its last output:\n%s", i, err, children[i].stderr.String())
		}
		children[i].cmd = nil
	}
	inFlight, permits, err := l.Counts(ctx, benchAdmissionPool.Name)
	if err != nil {
		return err
	}
	writes, err := poolRowWrites(ctx, pool, schema)
	if err != nil {
		return err
	}
	totals := admissionTotals{inFlight: inFlight, permits: permits, poolWrites: writes, machine: machine, server: -1}
	if serverBefore.serverOK && serverAfter.serverOK {
		totals.server = max(serverAfter.server-serverBefore.server, 0)
	}
	return reportAdmission(c, o, shares, peak, totals, stdout, stderr)
}

// childGOMAXPROCS is the GOMAXPROCS each of n bench processes gets: its
// share of this machine's cores, at least one, as a fleet's processes each
// have their own. Left to the default, eight processes on two cores would
// each keep two schedulers spinning for work, spending CPU that is the
// bench's and not the limiter's. 0 when GOMAXPROCS is set: the children
// inherit it.
func childGOMAXPROCS(n int) int {
	if os.Getenv("GOMAXPROCS") != "" {
		return 0
	}
	return max(1, runtime.NumCPU()/max(n, 1))
}

// gomaxprocsLabel prints a childGOMAXPROCS for the report.
func gomaxprocsLabel(procs int) string {
	if procs == 0 {
		return "$GOMAXPROCS=" + os.Getenv("GOMAXPROCS")
	}
	return strconv.Itoa(procs)
}

// admissionLoad says which load a run's latency is for.
func admissionLoad(o benchOptions) string {
	load := fmt.Sprintf("closed loop: %d acquirers, each acquiring again as soon as it released", o.producers*o.workers)
	if o.arrivals > 0 {
		load = fmt.Sprintf("open loop: %.0f acquires/s offered, timed from their scheduled arrival", o.arrivals)
	}
	if o.hold > 0 {
		load += fmt.Sprintf(", each permit held %v", o.hold)
	}
	return load
}

// admissionTotals is what the parent reads from the database after a run.
type admissionTotals struct {
	inFlight, permits int
	poolWrites        int64 // updates of the bench pool's row during the run (and the warm-up)
	// machine is the whole machine's CPU from the start signal to the last
	// process's figures: the bench processes, PostgreSQL when it runs on
	// the same machine, and anything else.
	machine machineCPU
	// server is the CPU of this machine's postgres processes over the same
	// window (every session's, not only the bench's); negative when no
	// postgres process is seen.
	server time.Duration
}

// machineCPU is CPU time summed over every core of the machine, from the
// first line of /proc/stat.
type machineCPU struct {
	busy, all float64 // seconds; all includes idle and I/O wait
	ok        bool    // false when /proc/stat could not be read
}

// readMachineCPU reads the machine's CPU counters so far.
func readMachineCPU() machineCPU {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	return parseMachineCPU(string(stat))
}

// parseMachineCPU reads the "cpu" line of /proc/stat: user, nice, system,
// idle, iowait, irq, softirq and steal, in ticks taken as 1/100s (Linux's
// USER_HZ, as procCPU takes them). Guest time is already in user and nice.
// Fields past steal, or a kernel that lists fewer than idle's, are
// handled; anything else is not a stat line.
func parseMachineCPU(stat string) machineCPU {
	line, _, _ := strings.Cut(stat, "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return machineCPU{}
	}
	// Seconds as floats: summed over many cores for months, ticks in
	// nanoseconds would overflow a time.Duration.
	var seconds [8]float64
	for i := range min(len(seconds), len(fields)-1) {
		ticks, err := strconv.ParseUint(fields[i+1], 10, 64)
		if err != nil {
			return machineCPU{}
		}
		seconds[i] = float64(ticks) / 100
	}
	idle := seconds[3] + seconds[4]
	busy := seconds[0] + seconds[1] + seconds[2] + seconds[5] + seconds[6] + seconds[7]
	return machineCPU{busy: busy, all: busy + idle, ok: true}
}

// since is the CPU used between earlier and m.
func (m machineCPU) since(earlier machineCPU) machineCPU {
	if !m.ok || !earlier.ok {
		return machineCPU{}
	}
	return machineCPU{busy: m.busy - earlier.busy, all: m.all - earlier.all, ok: true}
}

// poolRowWrites reads how many times the bench pool's row was updated:
// every grant cycle writes it once or twice (releases, then grants), so
// the seconds per write is the row lock's service time when it is the
// bottleneck. The bench processes' statistics are flushed when their
// connections close; it waits until the count stops moving.
func poolRowWrites(ctx context.Context, pool *pgxpool.Pool, schema string) (int64, error) {
	var last int64 = -1
	for range 20 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'admission_pools'`, schema).Scan(&n); err != nil {
			return 0, fmt.Errorf("reading the pool row's writes: %w", err)
		}
		if n == last {
			return n, nil
		}
		last = n
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return 0, ctx.Err()
		}
	}
	return last, nil
}

// reportAdmission prints the run's figures: totals, latency, how evenly
// the processes were served, and connections.
func reportAdmission(c *common, o benchOptions, shares []admissionShare, peak connectionPeak, totals admissionTotals, stdout, stderr io.Writer) error {
	var all admissionShare
	firstDone := time.Time{}
	for _, s := range shares {
		if s.CPU < 0 || all.CPU < 0 {
			all.CPU = -1
		} else {
			all.CPU += s.CPU
		}
		all.Grants += s.Grants
		all.Allocs += s.Allocs
		all.RoundTrips += s.RoundTrips
		all.Denials += s.Denials
		all.Unavailable += s.Unavailable
		if all.FirstError == "" {
			all.FirstError = s.FirstError
		}
		all.AcquireMS = append(all.AcquireMS, s.AcquireMS...)
		if all.Start.IsZero() || s.Start.Before(all.Start) {
			all.Start = s.Start
		}
		if s.End.After(all.End) {
			all.End = s.End
		}
		if firstDone.IsZero() || s.End.Before(firstDone) {
			firstDone = s.End
		}
	}
	// Fairness is judged while every process was still working: grants
	// up to the moment the first process finished its share.
	minGrants, sum := -1, 0
	for _, s := range shares {
		n := 0
		for _, at := range s.GrantedAtUS {
			if at <= firstDone.UnixMicro() {
				n++
			}
		}
		sum += n
		if minGrants < 0 || n < minGrants {
			minGrants = n
		}
	}
	mean := float64(sum) / float64(len(shares))
	seconds := all.End.Sub(all.Start).Seconds()
	slices.Sort(all.AcquireMS)
	grantsPerS := float64(all.Grants) / seconds
	// Little's law: in a closed loop every acquirer is always acquiring,
	// holding or releasing, so the mean of one such round is acquirers
	// divided by throughput, whatever the limiter does.
	littleMS := 0.0
	if o.arrivals == 0 && grantsPerS > 0 {
		littleMS = float64(o.producers*o.workers) / grantsPerS * 1000
	}
	lockWaitShare := 0.0
	if peak.samples > 0 {
		lockWaitShare = float64(peak.lockWaits) / float64(peak.samples)
	}
	msPerWrite := 0.0
	if totals.poolWrites > 0 {
		msPerWrite = seconds * 1000 / float64(totals.poolWrites)
	}
	cpu := grantCPU(all, totals)
	result := map[string]any{
		"processes": o.producers, "workers": o.workers, "arrivals_per_s": o.arrivals, "hold_ms": o.hold.Seconds() * 1000,
		"load": admissionLoad(o), "grants": all.Grants, "denials": all.Denials,
		"unavailable": all.Unavailable,
		"seconds":     seconds, "grants_per_s": grantsPerS, "closed_loop_round_ms": littleMS,
		"acquire_p50_ms": percentile(all.AcquireMS, 0.50), "acquire_p99_ms": percentile(all.AcquireMS, 0.99),
		"acquire_max_ms":     percentile(all.AcquireMS, 1),
		"process_grants_min": minGrants, "process_grants_mean": mean,
		"peak_conns_per_process": peak.perProcess, "peak_conns_total": peak.total,
		"conn_budget_per_process": admission.DefaultMaxConns,
		"pool_row_writes":         totals.poolWrites, "ms_per_pool_row_write": msPerWrite, "lock_wait_share": lockWaitShare,
		"in_flight_after": totals.inFlight, "permits_after": totals.permits,
		"bench_cpu_us_per_grant": cpu.benchUS, "server_cpu_us_per_grant": cpu.serverUS, "other_cpu_us_per_grant": cpu.otherUS,
		"machine_busy_share": cpu.busyShare, "allocs_per_grant": meanPerGrant(float64(all.Allocs), all.Grants),
		"round_trips_per_grant": meanPerGrant(float64(all.RoundTrips), all.Grants),
		"process_gomaxprocs":    gomaxprocsLabel(childGOMAXPROCS(o.producers)),
	}
	if all.Unavailable > 0 {
		fmt.Fprintf(stderr, "llmq bench: %d acquires were told the limiter is unavailable; the first: %s\n", all.Unavailable, all.FirstError)
	}
	if cpu.busyShare >= saturatedShare {
		fmt.Fprintf(stderr, "llmq bench: the machine's CPU was %.0f%% busy during the run, so acquire latency includes waiting for a core; "+
			"it describes this machine as much as the limiter (see machine_busy_share)\n", 100*cpu.busyShare)
	}
	if peak.err != nil {
		fmt.Fprintf(stderr, "llmq bench: sampling pg_stat_activity failed, connection peaks are incomplete: %v\n", peak.err)
	}
	if c.json {
		return json.NewEncoder(stdout).Encode(result)
	}
	fmt.Fprintf(stdout, "llmq admission load=%q\n", admissionLoad(o))
	fmt.Fprintf(stdout, "llmq admission processes=%d workers=%d arrivals_per_s=%.0f hold_ms=%.0f grants=%d seconds=%.3f grants_per_s=%.0f acquire_p50_ms=%.2f acquire_p99_ms=%.2f acquire_max_ms=%.2f "+
		"unavailable=%d process_grants_min=%d process_grants_mean=%.0f peak_conns_per_process=%d peak_conns_total=%d conn_budget_per_process=%d "+
		"closed_loop_round_ms=%.1f pool_row_writes=%d ms_per_pool_row_write=%.3f lock_wait_share=%.2f in_flight_after=%d permits_after=%d "+
		"bench_cpu_us_per_grant=%.0f server_cpu_us_per_grant=%.0f other_cpu_us_per_grant=%.0f machine_busy_share=%.2f allocs_per_grant=%.1f round_trips_per_grant=%.2f process_gomaxprocs=%s\n",
		o.producers, o.workers, o.arrivals, o.hold.Seconds()*1000, all.Grants, seconds, grantsPerS, result["acquire_p50_ms"], result["acquire_p99_ms"], result["acquire_max_ms"],
		all.Unavailable, minGrants, mean, peak.perProcess, peak.total, admission.DefaultMaxConns,
		littleMS, totals.poolWrites, msPerWrite, lockWaitShare, totals.inFlight, totals.permits,
		cpu.benchUS, cpu.serverUS, cpu.otherUS, cpu.busyShare, result["allocs_per_grant"], result["round_trips_per_grant"], result["process_gomaxprocs"])
	return nil
}

// meanPerGrant divides a run's total by its grants; 0 without grants.
func meanPerGrant(total float64, grants int) float64 {
	if grants == 0 {
		return 0
	}
	return total / float64(grants)
}

// saturatedShare is the busy share of the machine's CPU above which the
// bench warns that its latency includes waiting for a core.
const saturatedShare = 0.9

// grantCPUFigures is where a run's CPU went, per grant. Each figure is -1
// when it could not be read (no /proc).
type grantCPUFigures struct {
	benchUS   float64 // the bench processes' own CPU, µs per grant
	serverUS  float64 // the local postgres processes' CPU, µs per grant
	otherUS   float64 // the rest of the machine's busy CPU (PostgreSQL, if local, and anything else), µs per grant
	busyShare float64 // the machine's busy CPU over all of its CPU, 0 to 1
}

// grantCPU divides the run's CPU by its grants. The bench processes
// measure their own CPU from their start to their end; the machine's is
// measured by the parent over a slightly longer window (start signal to
// last figures), so other_cpu_us_per_grant and server_cpu_us_per_grant
// slightly overstate theirs.
func grantCPU(all admissionShare, totals admissionTotals) grantCPUFigures {
	f := grantCPUFigures{benchUS: -1, serverUS: -1, otherUS: -1, busyShare: -1}
	if all.Grants == 0 {
		return f
	}
	perGrant := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(all.Grants) }
	if all.CPU >= 0 {
		f.benchUS = perGrant(all.CPU)
	}
	if totals.server >= 0 {
		f.serverUS = perGrant(totals.server)
	}
	machine := totals.machine
	if machine.ok && machine.all > 0 {
		f.busyShare = machine.busy / machine.all
		if all.CPU >= 0 {
			f.otherUS = max(machine.busy-all.CPU.Seconds(), 0) * 1e6 / float64(all.Grants)
		}
	}
	return f
}

// connectionPeak is the most connections the bench processes held at once.
type connectionPeak struct {
	perProcess int // the most any one process held
	total      int // the most all of them held together
	samples    int // connections seen, over all samples
	lockWaits  int // of them, waiting for a lock (the pool row's, in this bench)
	err        error
}

// sampleConnections counts the bench processes' connections in
// pg_stat_activity, by application name, every 20ms until ctx ends, and
// then sends the peaks.
func sampleConnections(ctx context.Context, pool *pgxpool.Pool) <-chan connectionPeak {
	out := make(chan connectionPeak, 1)
	go func() {
		var p connectionPeak
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var most, total, waiting int
			err := pool.QueryRow(ctx, `SELECT coalesce(max(n), 0), coalesce(sum(n), 0), coalesce(sum(w), 0) FROM (
				SELECT count(*) AS n, count(*) FILTER (WHERE wait_event_type = 'Lock') AS w
				FROM pg_stat_activity WHERE application_name LIKE $1 || '-%' GROUP BY application_name) AS a`,
				benchAdmissionApp).Scan(&most, &total, &waiting)
			if ctx.Err() != nil {
				out <- p
				return
			}
			if err != nil && p.err == nil {
				p.err = err
			}
			p.perProcess, p.total = max(p.perProcess, most), max(p.total, total)
			p.samples, p.lockWaits = p.samples+total, p.lockWaits+waiting
			select {
			case <-ctx.Done():
				out <- p
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// percentile of sorted values, q in [0, 1]: the nearest rank, the
// largest value for q = 1, zero for no values.
func percentile[T cmp.Ordered](sorted []T, q float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// benchAdmissionWorker is one bench process: o.jobs grants from o.workers
// goroutines, each acquire timed, each permit released as answered. Its
// pool may open twice the limiter's connection budget, so the peak the
// parent measures is the limiter's own use.
func benchAdmissionWorker(ctx context.Context, c *common, o benchOptions, schema string, start io.Reader, stdout io.Writer) error {
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 2 * admission.DefaultMaxConns
	trips := &tripCounter{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: schema, Holder: "bench"})
	if err != nil {
		return err
	}
	// Connect, and run a few grouped and lone cycles, so the measured phase
	// does not start by connecting and preparing statements.
	if err := warmAdmission(ctx, l); err != nil {
		return fmt.Errorf("bench process: warming up: %w", err)
	}
	fmt.Fprintln(stdout, "ready")
	_, _ = io.Copy(io.Discard, start) // the parent closes stdin to start everyone at once

	var (
		mu    sync.Mutex
		share = admissionShare{AcquireMS: make([]float64, 0, o.jobs), GrantedAtUS: make([]int64, 0, o.jobs)}
		left  = o.jobs
		wg    sync.WaitGroup
		fail  error
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		left--
		return left >= 0 && fail == nil
	}
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	tripsBefore, allocsBefore := trips.roundTrips.Load(), heapAllocs()
	share.Start = time.Now()
	cpuBefore := processCPU("self")
	arrivals := scheduleArrivals(ctx, o.arrivals, o.jobs)
	for range o.workers {
		wg.Go(func() {
			for take() {
				t0 := time.Now()
				if arrivals != nil {
					// Open loop: the acquire is timed from its scheduled
					// arrival, so time spent waiting for a free acquirer
					// counts too.
					at, ok := <-arrivals
					if !ok {
						return
					}
					t0 = at
				}
				p, err := l.Acquire(ctx, admission.Request{Pool: benchAdmissionPool.Name, Tenant: "bench", Tokens: 500})
				granted := time.Now()
				if err == nil && o.hold > 0 && !sleepUntil(ctx, granted.Add(o.hold)) {
					err = ctx.Err()
				}
				if err == nil {
					if err = p.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 300}); err != nil {
						err = fmt.Errorf("releasing: %w", err)
					}
				}
				mu.Lock()
				switch {
				case err == nil:
					share.Grants++
					share.AcquireMS = append(share.AcquireMS, float64(granted.Sub(t0).Microseconds())/1000)
					share.GrantedAtUS = append(share.GrantedAtUS, granted.UnixMicro())
				case errors.Is(err, admission.ErrWait):
					share.Denials++
				case errors.Is(err, admission.ErrUnavailable):
					share.Unavailable++
					if share.FirstError == "" {
						share.FirstError = err.Error()
					}
				default:
					fail = cmpErr(fail, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	share.End = time.Now()
	share.CPU = -1
	if cpuAfter := processCPU("self"); cpuBefore >= 0 && cpuAfter >= 0 {
		share.CPU = cpuAfter - cpuBefore
	}
	share.Allocs, share.RoundTrips = heapAllocs()-allocsBefore, trips.roundTrips.Load()-tripsBefore
	if err := stopProfile(); err != nil {
		return err
	}
	if fail != nil {
		return fmt.Errorf("bench process: %w", fail)
	}
	if err := l.Flush(ctx); err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(share)
}

// scheduleArrivals sends n arrival times perSecond apart, each when it is
// due, or returns nil for a closed loop (perSecond 0). The channel holds
// every arrival, so a late acquirer never holds the schedule back.
func scheduleArrivals(ctx context.Context, perSecond float64, n int) <-chan time.Time {
	if perSecond <= 0 {
		return nil
	}
	out := make(chan time.Time, n)
	interval := time.Duration(float64(time.Second) / perSecond)
	go func() {
		defer close(out)
		next := time.Now()
		for range n {
			if !sleepUntil(ctx, next) {
				return
			}
			out <- next
			next = next.Add(interval)
		}
	}()
	return out
}

// warmAdmission acquires and releases a few permits, alone and together.
func warmAdmission(ctx context.Context, l *admission.Postgres) error {
	var (
		mu   sync.Mutex
		fail error
	)
	for _, together := range []int{1, 8, 8} {
		var wg sync.WaitGroup
		for range together {
			wg.Go(func() {
				p, err := l.Acquire(ctx, admission.Request{Pool: benchAdmissionPool.Name, Tenant: "bench"})
				if err == nil {
					err = p.Release(ctx, admission.CallOutcome{Result: admission.CallNotSent})
				}
				mu.Lock()
				fail = cmpErr(fail, err)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	return fail
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.buf.String())
}
