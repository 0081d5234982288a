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
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/outbox"
)

// How `llmq bench -mode relay` runs a fleet of relays:
//
//   - The bench holds the relays' leader lease itself (as benchGateHolder)
//     while the relays start, so every relay starts as a standby and the
//     backlog waits, written and vacuumed.
//   - It starts -workers relays, each in Run as a pod would: with the
//     memory broker, each in a process of its own (this binary re-executed,
//     one pool each); with rabbitmq and kafka, as goroutines of this
//     process sharing its pool and publisher.
//   - Once all stand by, it frees the lease. One relay takes it at its next
//     check and publishes the backlog. The time is the database's, from
//     that acquisition to the last event marked published, so the standbys'
//     check interval is not counted.
//   - Throughout, it samples pg_stat_activity for the relays' connections.

// benchRelayChild marks a process started by `llmq bench -mode relay` to
// run one relay; it names the schema. benchRelayIndex numbers the relay.
const (
	benchRelayChild = "LLMQ_BENCH_RELAY_SCHEMA"
	benchRelayIndex = "LLMQ_BENCH_RELAY_INDEX"
)

// benchGateHolder holds the lease while the relays start.
const benchGateHolder = "llmq-bench-gate"

// benchRelayStarting bounds the relay processes starting at once: each
// opens a connection for its first lease check, and Postgres has a
// connection limit.
const benchRelayStarting = 8

// Relay budgets of the outbox package documentation, printed beside the
// measured peaks.
const (
	relayBudgetActive  = 4
	relayBudgetStandby = 1
)

// relayShare is what one relay process reports when it stops.
type relayShare struct {
	Confirmed int `json:"confirmed"` // messages its broker confirmed
}

// relayBatchOf is the relays' BatchSize under options o: by default half
// the events' 1,000 keys, since a relay claims the next batch while one
// is published, which finds nothing when the batch in flight holds every
// key (see outbox.Relay.Drain).
func relayBatchOf(o benchOptions) int { return cmp.Or(o.batch, 500) }

// benchRelayConfig is the configuration of the bench's relay id, in this
// process or a relay process of its own.
func benchRelayConfig(o benchOptions, id int, log io.Writer) outbox.RelayConfig {
	return outbox.RelayConfig{ID: relayID(id), BatchSize: relayBatchOf(o), DeletePublished: o.deletePub, Logger: benchRelayLogger(log)}
}

// relayAppName names a relay's connections in pg_stat_activity.
func relayAppName(schema string, i int) string { return schema + "-relay-" + strconv.Itoa(i) }

// relayID is relay i's RelayConfig.ID.
func relayID(i int) string { return "bench-relay-" + strconv.Itoa(i) }

// relay writes -jobs outbox events up front, then times -workers relay
// processes publishing them all to the in-memory broker (each process has
// its own) and marking them published.
func (b *bench) relay(ctx context.Context, c *common) (float64, error) {
	if _, err := b.writeOutboxEvents(ctx, b.o.jobs); err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	var procs []*relayProcess
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	fleet := relayFleet{
		b: b, kind: "processes",
		cpu: func() []time.Duration {
			out := make([]time.Duration, len(procs))
			for i, p := range procs {
				out[i] = p.cpu()
			}
			return out
		},
		start: func(ctx context.Context) error {
			procs = make([]*relayProcess, b.o.workers)
			slots := make(chan struct{}, benchRelayStarting)
			errs := make(chan error, b.o.workers)
			var wg sync.WaitGroup
			for i := range procs {
				procs[i] = &relayProcess{index: i}
				wg.Go(func() {
					slots <- struct{}{}
					defer func() { <-slots }()
					errs <- procs[i].start(ctx, self, c.databaseURL, b.schema, relayBatchOf(b.o), b.o.deletePub, b.progress)
				})
			}
			wg.Wait()
			close(errs)
			return errors.Join(collect(errs)...)
		},
		stop: func() (int, error) {
			confirmed := 0
			var errs []error
			for _, p := range procs {
				share, err := p.stop()
				confirmed += share.Confirmed
				errs = append(errs, err)
			}
			return confirmed, errors.Join(errs...)
		},
	}
	elapsed, err := fleet.run(ctx, true)
	if err != nil {
		return 0, err
	}
	return elapsed, nil
}

// collect drains a closed channel of errors.
func collect(errs <-chan error) []error {
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return all
}

// runRelays times -workers relays, goroutines of this process, publishing
// every outbox event through pub and marking it published (rabbitmq and
// kafka modes).
func (b *bench) runRelays(ctx context.Context, events *outbox.Store, pub broker.Publisher) (float64, error) {
	return b.runRelaysOn(ctx, b.pool, events, pub)
}

// runRelaysOn is runRelays with the relays on pool.
func (b *bench) runRelaysOn(ctx context.Context, pool *pgxpool.Pool, events *outbox.Store, pub broker.Publisher) (float64, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, b.o.workers)
	fleet := relayFleet{
		b: b, kind: "goroutines",
		start: func(context.Context) error {
			for i := range b.o.workers {
				r, err := events.NewRelay(pool, pub, benchRelayConfig(b.o, i, b.progress))
				if err != nil {
					return err
				}
				go func() { done <- r.Run(runCtx) }()
			}
			return nil
		},
		stop: func() (int, error) {
			cancel()
			var errs []error
			for range b.o.workers {
				errs = append(errs, <-done)
			}
			return -1, errors.Join(errs...)
		},
	}
	return fleet.run(ctx, false)
}

// lockedWriter serialises writes: the bench's progress is written by the
// bench and by the loggers of its in-process relays at once.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// benchRelayLogger shows the relays' warnings, errors and hand-overs.
func benchRelayLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// relayFleet is one timed run of -workers relays.
type relayFleet struct {
	b     *bench
	kind  string // "processes" or "goroutines"
	start func(ctx context.Context) error
	// stop stops every relay and returns the messages their brokers
	// confirmed (-1: not counted there).
	stop func() (confirmed int, err error)
	// cpu returns the CPU time each relay's process has used so far (nil:
	// the relays are goroutines of this process; negative: not readable).
	cpu func() []time.Duration
}

// run times the fleet and reports its line: into the bench's report when
// toReport is set (the memory broker's mode, where the fleet's run is the
// finding), else on the progress output (the brokers' modes, which report
// their own finding).
func (f relayFleet) run(ctx context.Context, toReport bool) (float64, error) {
	b := f.b
	lease := b.schema + ".outbox_relay_lease"
	if _, err := b.pool.Exec(ctx, "UPDATE "+lease+" SET holder = $1, lease_epoch = lease_epoch + 1, lease_until = now() + interval '1 hour'", benchGateHolder); err != nil {
		return 0, fmt.Errorf("llmq bench: holding the relay lease while the relays start: %w", err)
	}
	sampler := startConnSampler(ctx, b.pool, b.schema+"-relay-")
	defer sampler.stop()
	fmt.Fprintf(b.progress, "llmq bench: starting %d relays (%s)\n", b.o.workers, f.kind)
	if err := f.start(ctx); err != nil {
		_, stopErr := f.stop()
		return 0, errors.Join(fmt.Errorf("llmq bench: starting the relays: %w", err), stopErr)
	}
	// Before the CPU sample: the standbys' CPU is divided by the time from
	// the lease's release, so none of the checkpoint's time may count.
	b.checkpoint(ctx)
	var cpuBefore []time.Duration
	if f.cpu != nil {
		cpuBefore = f.cpu()
	}
	// With -delete-published no published event is left to count and time
	// afterwards: the run's events are those waiting now (nothing can be
	// published while the bench holds the lease).
	var waiting int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".outbox WHERE published_at IS NULL").Scan(&waiting); err != nil {
		return 0, fmt.Errorf("llmq bench: counting the events to relay: %w", err)
	}
	released := time.Now()
	if _, err := b.pool.Exec(ctx, "UPDATE "+lease+" SET lease_until = '-infinity' WHERE holder = $1", benchGateHolder); err != nil {
		return 0, err
	}
	fmt.Fprintf(b.progress, "llmq bench: %d relays standing by; lease freed, relaying %d events\n", b.o.workers, b.o.jobs)
	drainedAt, waitErr := f.waitDrained(ctx)
	drained := time.Now()
	var cpuAfter []time.Duration
	if f.cpu != nil {
		cpuAfter = f.cpu()
	}
	// Read before the relays stop: a stopping active relay hands the lease
	// to a standby still running, and that one's connections are no part
	// of the run.
	peaks := sampler.stop()
	var (
		holder   string
		events   int
		seconds  float64
		takeover float64
	)
	timed := "from the takeover to the last event published"
	switch {
	case waitErr == nil && b.o.deletePub:
		// Deleted events leave no publication time: the run ends at the
		// database's time of the first look (every 20ms) that found none
		// waiting, so it may overstate the time by that much.
		events = waiting
		timed = "from the takeover to the first look (every 20ms) finding no event waiting"
		err := b.pool.QueryRow(ctx, "SELECT holder, extract(epoch FROM $1::timestamptz - acquired_at)::float8, extract(epoch FROM acquired_at - $2::timestamptz)::float8 FROM "+lease,
			drainedAt, released).Scan(&holder, &seconds, &takeover)
		if err != nil {
			waitErr = fmt.Errorf("llmq bench: reading the run's times: %w", err)
		}
	case waitErr == nil:
		// The events of this run are those published since the takeover
		// (the rabbitmq mode runs several rounds on one outbox).
		err := b.pool.QueryRow(ctx, "SELECT l.holder, count(*), extract(epoch FROM max(o.published_at) - l.acquired_at)::float8, extract(epoch FROM l.acquired_at - $1::timestamptz)::float8 FROM "+
			lease+" AS l JOIN "+b.schema+".outbox AS o ON o.published_at >= l.acquired_at GROUP BY l.holder, l.acquired_at", released).Scan(&holder, &events, &seconds, &takeover)
		if err != nil {
			waitErr = fmt.Errorf("llmq bench: reading the run's times: %w", err)
		}
	}
	confirmed, stopErr := f.stop()
	if err := errors.Join(waitErr, stopErr); err != nil {
		return 0, err
	}
	if confirmed >= 0 && confirmed < events {
		return 0, fmt.Errorf("llmq bench: the relays' brokers confirmed %d of %d events", confirmed, events)
	}
	active := -1
	if n, ok := strings.CutPrefix(holder, "bench-relay-"); ok {
		active, _ = strconv.Atoi(n)
	}
	report := relayFleetReport{
		Relays: b.o.workers, As: f.kind, Active: holder, Events: events, Seconds: seconds,
		EventsPerSecond: float64(events) / seconds, TakeoverAfterFreeSeconds: takeover, Timed: timed,
	}
	if f.kind == "processes" {
		activePeak, standbyPeak, total := peaks.split(b.schema+"-relay-", active)
		report.PeakConnections = &relayPeaks{ActiveRelay: activePeak, ActiveBudget: relayBudgetActive,
			StandbyRelay: standbyPeak, StandbyBudget: relayBudgetStandby, AllRelays: total}
	}
	if cpuAfter != nil {
		report.CPU = relayCPU(cpuBefore, cpuAfter, active, drained.Sub(released))
		report.CPUUnreadable = report.CPU == nil
	}
	if toReport {
		b.report.relayFleet(report)
	} else {
		report.print(b.progress)
	}
	return seconds, nil
}

// relayCPU measures the CPU the relay processes used from the lease's
// release to the drained backlog (a window slightly longer than the timed
// one, which starts at the takeover): the active relay's, and the
// standbys' together, also as a share of the window. It is nil when /proc
// could not be read.
func relayCPU(before, after []time.Duration, active int, window time.Duration) *relayCPUReport {
	var activeCPU, standbys time.Duration
	for i := range after {
		if before[i] < 0 || after[i] < 0 {
			return nil
		}
		if i == active {
			activeCPU = after[i] - before[i]
		} else {
			standbys += after[i] - before[i]
		}
	}
	return &relayCPUReport{ActiveRelaySeconds: activeCPU.Seconds(), StandbyRelaysSeconds: standbys.Seconds(),
		StandbyCorePercent: 100 * standbys.Seconds() / window.Seconds(), WindowSeconds: window.Seconds()}
}

// waitDrained waits until no event is unpublished, reporting progress, and
// returns the database's time of the look that found none; it fails,
// saying why, when nothing was published for a minute.
func (f relayFleet) waitDrained(ctx context.Context) (time.Time, error) {
	b := f.b
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	lastReport, lastProgress := time.Now(), time.Now()
	lastPending := -1
	for {
		var (
			pending bool
			at      time.Time
		)
		if err := b.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+b.schema+".outbox WHERE published_at IS NULL), clock_timestamp()").Scan(&pending, &at); err != nil {
			return time.Time{}, fmt.Errorf("llmq bench: reading the backlog: %w", err)
		}
		if !pending {
			return at, nil
		}
		if time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			var n int
			var holder *string
			if err := b.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+b.schema+".outbox WHERE published_at IS NULL), (SELECT holder FROM "+b.schema+".outbox_relay_lease)").Scan(&n, &holder); err != nil {
				return time.Time{}, fmt.Errorf("llmq bench: reading the backlog: %w", err)
			}
			fmt.Fprintf(b.progress, "llmq bench: %d of %d events unpublished; lease held by %s\n", n, b.o.jobs, cmp.Or(derefString(holder), "nobody"))
			if n != lastPending {
				lastPending, lastProgress = n, time.Now()
			} else if time.Since(lastProgress) > time.Minute {
				return time.Time{}, fmt.Errorf("llmq bench: no event published for a minute (%d unpublished, lease held by %s): see the relays' messages above", n, cmp.Or(derefString(holder), "nobody"))
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
	}
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// connSampler samples pg_stat_activity every 20ms and keeps, per
// application name with the prefix, the most connections seen at once,
// and the most of all of them at once.
type connSampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	peaks  connPeaks
}

type connPeaks struct {
	byName map[string]int
	total  int
}

func startConnSampler(ctx context.Context, pool *pgxpool.Pool, prefix string) *connSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &connSampler{cancel: cancel, done: make(chan struct{}), peaks: connPeaks{byName: map[string]int{}}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			s.sample(ctx, pool, prefix)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// sample reads pg_stat_activity once. A failed reading is skipped: the
// sampler measures, it does not judge the run.
func (s *connSampler) sample(ctx context.Context, pool *pgxpool.Pool, prefix string) {
	rows, err := pool.Query(ctx, "SELECT application_name, count(*) FROM pg_stat_activity WHERE starts_with(application_name, $1) GROUP BY 1", prefix)
	if err != nil {
		return
	}
	counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Name string
		N    int
	}])
	if err != nil {
		return
	}
	total := 0
	for _, c := range counts {
		s.peaks.byName[c.Name] = max(s.peaks.byName[c.Name], c.N)
		total += c.N
	}
	s.peaks.total = max(s.peaks.total, total)
}

// stop ends the sampling (once; later calls return the same peaks).
func (s *connSampler) stop() connPeaks {
	s.cancel()
	<-s.done
	return s.peaks
}

// split returns the peak of the active relay's process, the highest of
// the others', and the peak of all together.
func (p connPeaks) split(prefix string, active int) (activePeak, standbyPeak, total int) {
	for name, n := range p.byName {
		if name == prefix+strconv.Itoa(active) {
			activePeak = n
		} else {
			standbyPeak = max(standbyPeak, n)
		}
	}
	return activePeak, standbyPeak, p.total
}

// relayProcess is one relay process of the bench.
type relayProcess struct {
	index  int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *tailWriter
}

func (p *relayProcess) start(ctx context.Context, self, databaseURL, schema string, batch int, deletePublished bool, progress io.Writer) error {
	p.cmd = exec.CommandContext(ctx, self, "bench", "-mode", "relay", "-database-url", databaseURL, "-claim-batch", strconv.Itoa(batch),
		"-delete-published="+strconv.FormatBool(deletePublished))
	p.cmd.Env = append(os.Environ(), benchRelayChild+"="+schema, benchRelayIndex+"="+strconv.Itoa(p.index))
	p.stderr = &tailWriter{w: progress, prefix: fmt.Sprintf("relay %d: ", p.index)}
	p.cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	p.out = bufio.NewReader(out)
	if err := p.cmd.Start(); err != nil {
		p.cmd = nil
		return fmt.Errorf("starting relay process %d: %w", p.index, err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil || line != "ready\n" {
		return p.failed("was not ready", line, err)
	}
	return nil
}

// failed describes a process that did not do what it was asked: what it
// printed, how it exited, and the end of its stderr.
func (p *relayProcess) failed(what, said string, err error) error {
	_ = p.stdin.Close()
	exit := "status 0"
	if waitErr := p.cmd.Wait(); waitErr != nil {
		exit = waitErr.Error()
	}
	p.cmd = nil
	return fmt.Errorf("relay process %d %s (it printed %q; exit: %s; its last messages: %s): %w",
		p.index, what, said, exit, p.stderr.tail(), cmp.Or(err, errors.New("unexpected output")))
}

// stop asks the relay to stop (its stdin closes), reads its report and
// waits for it to exit.
func (p *relayProcess) stop() (relayShare, error) {
	var share relayShare
	if p.cmd == nil {
		return share, nil
	}
	_ = p.stdin.Close()
	line, err := p.out.ReadString('\n')
	if err != nil {
		return share, p.failed("stopped without its report", line, err)
	}
	if err := json.Unmarshal([]byte(line), &share); err != nil {
		return share, p.failed("reported nonsense", line, err)
	}
	if err := p.cmd.Wait(); err != nil {
		p.cmd = nil
		return share, fmt.Errorf("relay process %d: %w; its last messages: %s", p.index, err, p.stderr.tail())
	}
	p.cmd = nil
	return share, nil
}

// cpu returns the CPU time (user and system) the process has used, from
// /proc; negative when that cannot be read.
func (p *relayProcess) cpu() time.Duration {
	if p.cmd == nil || p.cmd.Process == nil {
		return -1
	}
	return processCPU(strconv.Itoa(p.cmd.Process.Pid))
}

// processCPU is the CPU time (user and system) process pid (a number, or
// "self") has used, from /proc; -1 when that cannot be read.
func processCPU(pid string) time.Duration {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	return procCPU(string(stat))
}

// procCPU reads utime and stime (fields 14 and 15, in clock ticks) from a
// /proc/<pid>/stat line, or -1 when it is not one; the ticks are taken
// as 1/100s, Linux's USER_HZ. The command name (field 2) may hold spaces,
// so fields are counted after its closing parenthesis.
func procCPU(stat string) time.Duration {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return -1
	}
	fields := strings.Fields(stat[i+1:])
	if len(fields) < 13 {
		return -1
	}
	// 36 bits of ticks are 21 years of CPU: more is not a stat line of a
	// bench process, and two such sums still fit a Duration.
	utime, err1 := strconv.ParseUint(fields[11], 10, 36)
	stime, err2 := strconv.ParseUint(fields[12], 10, 36)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func (p *relayProcess) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// tailWriter passes a process's stderr on, each line prefixed, and keeps
// its last 4 KiB for error messages.
type tailWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	last   []byte
	buf    []byte // an incomplete line
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last = append(t.last, p...)
	if len(t.last) > 4096 {
		t.last = t.last[len(t.last)-4096:]
	}
	t.buf = append(t.buf, p...)
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(t.w, "%s%s\n", t.prefix, t.buf[:i])
		t.buf = t.buf[i+1:]
	}
	return len(p), nil
}

func (t *tailWriter) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.last) == 0 {
		return "(none)"
	}
	return strings.TrimSpace(string(t.last))
}

// benchRelayWorker is one relay process: it runs a relay on its own pool
// and memory broker, says "ready" once the relay stands by holding no
// connection, and stops when its stdin closes, reporting what its broker
// confirmed.
func benchRelayWorker(ctx context.Context, c *common, o benchOptions, schema string, index int, stop io.Reader, stdout, stderr io.Writer) error {
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return fmt.Errorf("database url: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = relayAppName(schema, index)
	// A pod's pool serves other components too; this one serves only the
	// relay, so it keeps no idle connection, and what pg_stat_activity
	// shows is what the relay uses. (A pod's pool would keep one, and
	// Postgres's connection limit would not hold 100 relays' idle ones on
	// a shared test server.) The pool's health check closes idle
	// connections; it runs twice a second, not more often: in a standby,
	// which does nothing else but check the lease every few seconds, a
	// 100ms health check was four fifths of its CPU.
	cfg.MaxConns = relayBudgetActive
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = 100 * time.Millisecond
	cfg.HealthCheckPeriod = 500 * time.Millisecond
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	events, err := outbox.NewStore(outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	mem := memory.New(memory.Config{})
	defer func() { _ = mem.Close() }()
	r, err := events.NewRelay(pool, mem.Publisher(), benchRelayConfig(o, index, stderr))
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	// Ready: the relay checked the lease (a connection was made) and the
	// pool has closed that connection again.
	deadline := time.Now().Add(time.Minute)
	for pool.Stat().NewConnsCount() == 0 || pool.Stat().TotalConns() > 0 {
		if time.Now().After(deadline) {
			cancel()
			return errors.Join(fmt.Errorf("relay %d: not standing by idle after a minute (%d connections open, %d made)", index, pool.Stat().TotalConns(), pool.Stat().NewConnsCount()), <-done)
		}
		select {
		case err := <-done:
			return fmt.Errorf("relay %d stopped before it was ready: %w", index, cmp.Or(err, errors.New("no error")))
		case <-time.After(10 * time.Millisecond):
		}
	}
	fmt.Fprintln(stdout, "ready")
	_, _ = io.Copy(io.Discard, stop) // the parent closes stdin to stop the relay
	cancel()
	if err := <-done; err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(relayShare{Confirmed: mem.Published("bench")})
}
