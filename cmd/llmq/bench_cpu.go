package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// cpuSample is the CPU time used so far by the bench process (client) and
// by this machine's PostgreSQL processes (server), read from /proc.
type cpuSample struct {
	client, server time.Duration
	// allocs is how many heap objects the bench process has allocated so
	// far (runtime.MemStats.Mallocs): what the garbage collector then has
	// to sweep, a share of the client's CPU that load does not change.
	allocs uint64
	// clientOK and serverOK are false when that part could not be read: no
	// /proc, or no postgres process on this machine (the database is
	// elsewhere).
	clientOK, serverOK bool
}

// sampleCPU reads the CPU the bench and PostgreSQL have used so far, and
// the bench's allocations. Reading the allocation count stops the world
// for a moment, twice a run.
func sampleCPU() cpuSample {
	s := cpuSample{allocs: heapAllocs()}
	if d := processCPU("self"); d >= 0 {
		s.client, s.clientOK = d, true
	}
	s.server, s.serverOK = postgresCPU("/proc")
	return s
}

// heapAllocs is how many heap objects this process has allocated so far.
func heapAllocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// postgresCPU sums the CPU time of every process named "postgres" under
// procRoot: each one's own (utime and stime) and what its reaped children
// used (cutime and cstime). Backends that exit are reaped by the
// postmaster, so the sum keeps what they used: the difference of two sums
// is the server's CPU in between, backends that came and went included.
// ok is false when no postgres process is seen.
func postgresCPU(procRoot string) (total time.Duration, ok bool) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(procRoot + "/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since the listing
		}
		if d, isPostgres := postgresStatCPU(string(stat)); isPostgres {
			total, ok = total+d, true
		}
	}
	return total, ok
}

// postgresStatCPU reads a /proc/<pid>/stat line: whether its command is
// postgres, and then utime + stime + cutime + cstime (fields 14 to 17, in
// USER_HZ ticks of 1/100 s).
func postgresStatCPU(stat string) (time.Duration, bool) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open || stat[open+1:end] != "postgres" {
		return 0, false
	}
	fields := strings.Fields(stat[end+1:])
	if len(fields) < 15 {
		return 0, false
	}
	var ticks uint64
	for _, f := range fields[11:15] {
		n, err := strconv.ParseUint(f, 10, 36)
		if err != nil {
			return 0, false
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, true
}

// cpuReport is the CPU a timed phase cost per job: the bench process's
// (the runner, the producers, the pgx client) and PostgreSQL's, when it
// runs on this machine.
type cpuReport struct {
	ClientUSPerJob float64 `json:"client_us_per_job"`
	// ClientAllocsPerJob is the bench process's heap allocations per job.
	ClientAllocsPerJob float64 `json:"client_allocs_per_job"`
	// ServerUSPerJob is omitted when no local postgres process was seen.
	ServerUSPerJob *float64 `json:"server_us_per_job,omitempty"`
}

// cpu records the CPU of the phase between from and to, over jobs.
func (r *benchReport) cpu(from, to cpuSample, jobs int) {
	if !from.clientOK || !to.clientOK || jobs <= 0 {
		return
	}
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(jobs) }
	c := &cpuReport{ClientUSPerJob: perJob(to.client - from.client), ClientAllocsPerJob: float64(to.allocs-from.allocs) / float64(jobs)}
	if from.serverOK && to.serverOK {
		server := perJob(max(to.server-from.server, 0))
		c.ServerUSPerJob = &server
	}
	r.CPU = c
}

// print writes the CPU line of a report.
func (c *cpuReport) print(w io.Writer) error {
	server := "unknown (no local postgres process)"
	if c.ServerUSPerJob != nil {
		server = fmt.Sprintf("%.1f", *c.ServerUSPerJob)
	}
	_, err := fmt.Fprintf(w, "llmq cpu per job: client_us=%.1f server_us=%s client_allocs=%.1f\n", c.ClientUSPerJob, server, c.ClientAllocsPerJob)
	return err
}

// startCPUProfile profiles this process into path until the returned func
// is called; with no path it does nothing.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
