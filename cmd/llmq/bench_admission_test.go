package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// One bench process, run in-process: it waits for the start signal (its
// stdin closing), makes its share of grants and reports them. (The whole
// mode re-executes the llmq binary, which a test binary is not.)
func TestBenchAdmissionWorker(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		arrivals float64
		hold     time.Duration
	}{{"closed loop", 0, 0}, {"open loop", 500, 0}, {"held permits", 0, 5 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			share := runBenchAdmissionWorker(t, benchOptions{jobs: 50, workers: 2, arrivals: c.arrivals, hold: c.hold})
			if c.arrivals > 0 {
				// 50 arrivals 2ms apart: the last is scheduled 98ms after
				// the first, so the share cannot end sooner.
				require.GreaterOrEqual(t, share.End.Sub(share.Start), 98*time.Millisecond)
			}
			if c.hold > 0 {
				// 25 permits per acquirer, one after another, each held 5ms.
				require.GreaterOrEqual(t, share.End.Sub(share.Start), 25*c.hold)
			}
		})
	}
}

// runBenchAdmissionWorker runs one bench process in-process on a fresh
// pool and requires that it granted its share and left nothing held.
func runBenchAdmissionWorker(t *testing.T, o benchOptions) admissionShare {
	t.Helper()
	c := setup(t)
	_, pool := c.migrated()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: c.schema})
	require.NoError(t, err)
	require.NoError(t, l.SetPool(t.Context(), benchAdmissionPool))

	var out bytes.Buffer
	err = benchAdmissionWorker(t.Context(), &common{databaseURL: dbtest.URL()}, o, c.schema, strings.NewReader(""), &out)
	require.NoError(t, err)
	line, rest, ok := strings.Cut(out.String(), "\n")
	require.True(t, ok)
	require.Equal(t, "ready", line)
	var share admissionShare
	require.NoError(t, json.Unmarshal([]byte(rest), &share))
	require.Equal(t, o.jobs, share.Grants)
	require.Len(t, share.AcquireMS, o.jobs)
	require.True(t, share.End.After(share.Start))
	require.Positive(t, share.Allocs)
	// An acquire and a release each take a cycle, one round trip each,
	// unless cycles of the two acquirers met.
	require.LessOrEqual(t, share.RoundTrips, int64(2*o.jobs))
	require.GreaterOrEqual(t, share.RoundTrips, int64(2*o.jobs/o.workers))
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		require.GreaterOrEqual(t, share.CPU, time.Duration(0), "the process's CPU is read from /proc")
	}
	inFlight, permits, err := l.Counts(t.Context(), benchAdmissionPool.Name)
	require.NoError(t, err)
	require.Zero(t, inFlight)
	require.Zero(t, permits)
	return share
}

// A bench process that dies is reported with its exit status and its last
// words, not as an unexplained end of its output.
func TestBenchAdmissionChildFailure(t *testing.T) {
	t.Parallel()
	tail := &tailBuffer{max: 64}
	cmd := exec.CommandContext(t.Context(), "sh", "-c", "echo connecting >&2; echo 'FATAL: sorry, too many clients already' >&2; exit 3")
	cmd.Stderr = tail
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	ch := &benchChild{cmd: cmd, out: bufio.NewReader(out), stderr: tail}
	var s admissionShare
	err = json.NewDecoder(ch.out).Decode(&s)
	require.ErrorIs(t, err, io.EOF)
	err = ch.failure(2, fmt.Errorf("reading its figures: %w", err))
	require.ErrorContains(t, err, "bench process 2")
	require.ErrorContains(t, err, "exit status 3")
	require.ErrorContains(t, err, "too many clients already")
}

// Fairness is counted while every process was working: up to the moment
// the first one finished its share.
func TestBenchAdmissionReport(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	at := func(ms ...int) []int64 {
		var us []int64
		for _, m := range ms {
			us = append(us, t0.Add(time.Duration(m)*time.Millisecond).UnixMicro())
		}
		return us
	}
	shares := []admissionShare{
		{Grants: 4, AcquireMS: []float64{1, 1, 1, 1}, GrantedAtUS: at(1, 2, 3, 4), Start: t0, End: t0.Add(4 * time.Millisecond), CPU: 3 * time.Millisecond,
			Allocs: 400, RoundTrips: 8},
		{Grants: 4, AcquireMS: []float64{1, 1, 1, 9}, GrantedAtUS: at(3, 10, 11, 12), Start: t0, End: t0.Add(12 * time.Millisecond), CPU: 5 * time.Millisecond,
			Allocs: 480, RoundTrips: 9},
	}
	var out, errOut bytes.Buffer
	machine := machineCPU{busy: 0.012, all: 0.024, ok: true}
	err := reportAdmission(&common{json: true}, benchOptions{producers: 2, workers: 1}, shares,
		connectionPeak{perProcess: 1, total: 2, samples: 10, lockWaits: 4}, admissionTotals{poolWrites: 6, machine: machine, server: 3 * time.Millisecond}, &out, &errOut)
	require.NoError(t, err)
	var r map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	require.InDelta(t, 1, r["process_grants_min"], 0, "the slow process had 1 grant when the first finished")
	require.InDelta(t, 2.5, r["process_grants_mean"], 0)
	require.InDelta(t, 8, r["grants"], 0)
	require.InDelta(t, 1, r["peak_conns_per_process"], 0)
	require.InDelta(t, 0.4, r["lock_wait_share"], 1e-9)
	require.InDelta(t, 2, r["ms_per_pool_row_write"], 1e-9, "12ms over 6 writes")
	require.InDelta(t, 3, r["closed_loop_round_ms"], 1e-9, "2 acquirers at 8 grants in 12ms: 3ms a round")
	require.Contains(t, r["load"], "closed loop: 2 acquirers")
	require.InDelta(t, 1000, r["bench_cpu_us_per_grant"], 1e-9, "8ms of the processes' CPU over 8 grants")
	require.InDelta(t, 500, r["other_cpu_us_per_grant"], 1e-9, "the machine's other 4ms over 8 grants")
	require.InDelta(t, 375, r["server_cpu_us_per_grant"], 1e-9, "postgres's 3ms over 8 grants")
	require.InDelta(t, 110, r["allocs_per_grant"], 1e-9, "880 allocations over 8 grants")
	require.InDelta(t, 17.0/8, r["round_trips_per_grant"], 1e-9)
	require.InDelta(t, 0.5, r["machine_busy_share"], 1e-9)
	require.Empty(t, errOut.String(), "a half-busy machine is not warned about")
}

// A run on a saturated machine says that its latency includes waiting for
// a core; one whose CPU could not be read says so in its figures (-1).
func TestBenchAdmissionReportSaturated(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	shares := []admissionShare{{Grants: 2, AcquireMS: []float64{1, 2}, GrantedAtUS: []int64{t0.UnixMicro(), t0.UnixMicro()},
		Start: t0, End: t0.Add(time.Millisecond), CPU: time.Millisecond}}
	report := func(machine machineCPU, cpu time.Duration) (map[string]any, string) {
		shares[0].CPU = cpu
		var out, errOut bytes.Buffer
		err := reportAdmission(&common{json: true}, benchOptions{producers: 1, workers: 1}, shares,
			connectionPeak{}, admissionTotals{machine: machine, server: -1}, &out, &errOut)
		require.NoError(t, err)
		var r map[string]any
		require.NoError(t, json.Unmarshal(out.Bytes(), &r))
		return r, errOut.String()
	}
	r, warned := report(machineCPU{busy: 0.095, all: 0.1, ok: true}, time.Millisecond)
	require.InDelta(t, 0.95, r["machine_busy_share"], 1e-9)
	require.Contains(t, warned, "the machine's CPU was 95% busy during the run")

	r, warned = report(machineCPU{}, -1)
	require.InDelta(t, -1, r["machine_busy_share"], 0)
	require.InDelta(t, -1, r["bench_cpu_us_per_grant"], 0)
	require.InDelta(t, -1, r["other_cpu_us_per_grant"], 0)
	require.InDelta(t, -1, r["server_cpu_us_per_grant"], 0, "no postgres process seen")
	require.Empty(t, warned)
}

// Each bench process gets its share of the machine's cores, unless the
// caller set GOMAXPROCS, which the processes then inherit.
func TestBenchAdmissionChildGOMAXPROCS(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	require.Equal(t, max(1, runtime.NumCPU()/2), childGOMAXPROCS(2))
	require.Equal(t, 1, childGOMAXPROCS(2*runtime.NumCPU()))
	t.Setenv("GOMAXPROCS", "3")
	require.Zero(t, childGOMAXPROCS(8))
	require.Equal(t, "$GOMAXPROCS=3", gomaxprocsLabel(0))
}

// The machine's CPU is read from the first line of /proc/stat.
func TestParseMachineCPU(t *testing.T) {
	t.Parallel()
	m := parseMachineCPU("cpu  100 5 50 800 40 3 2 1 7 0\ncpu0 50 2 25 400 20 1 1 0 3 0\nintr 1\n")
	require.True(t, m.ok)
	require.InDelta(t, 1.61, m.busy, 1e-9, "user, nice, system, irq, softirq and steal")
	require.InDelta(t, 10.01, m.all, 1e-9, "and idle and iowait")
	require.InDelta(t, 0.1, parseMachineCPU("cpu 10 0 0 0\n").all, 1e-9, "an old kernel's four fields")
	for _, bad := range []string{"", "cpu0 1 2 3 4", "cpu 1 2 x 4", "cpu 1 2 3", "cpu -1 2 3 4"} {
		require.False(t, parseMachineCPU(bad).ok, "%q", bad)
	}
	later := machineCPU{busy: 3, all: 10, ok: true}
	require.Equal(t, machineCPU{busy: 2, all: 6, ok: true}, later.since(machineCPU{busy: 1, all: 4, ok: true}))
	require.False(t, later.since(machineCPU{}).ok, "no reading before: no figure")
	if own := readMachineCPU(); !own.ok {
		t.Logf("no /proc/stat here: only the parser is checked")
	} else {
		require.Positive(t, own.all)
	}
}

func FuzzParseMachineCPU(f *testing.F) {
	f.Add("cpu  100 5 50 800 40 3 2 1 7 0\ncpu0 1\n")
	f.Add("cpu 1 2 3")
	f.Fuzz(func(t *testing.T, stat string) {
		m := parseMachineCPU(stat)
		if m.ok {
			require.GreaterOrEqual(t, m.busy, 0.0)
			require.GreaterOrEqual(t, m.all, m.busy)
		} else {
			require.Zero(t, m.all)
		}
	})
}

// The load a run's latency is for is stated: closed or open loop, and the
// hold time when there is one.
func TestBenchAdmissionLoad(t *testing.T) {
	t.Parallel()
	require.Equal(t, "closed loop: 1600 acquirers, each acquiring again as soon as it released",
		admissionLoad(benchOptions{producers: 16, workers: 100}))
	require.Equal(t, "open loop: 4000 acquires/s offered, timed from their scheduled arrival, each permit held 1s",
		admissionLoad(benchOptions{producers: 16, workers: 100, arrivals: 4000, hold: time.Second}))
}
