package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/admission"
)

// benchAdmissionChild marks a process started by `llmq bench -mode
// admission` to acquire and release permits; it names the schema.
const benchAdmissionChild = "LLMQ_BENCH_ADMISSION_SCHEMA"

// benchAdmissionPool has limits no grant reaches, so the bench measures the
// limiter itself: every acquire is granted, all on one hot pool row.
var benchAdmissionPool = admission.Pool{Name: "bench", RPM: 1 << 30, TPM: 1 << 50, MaxInFlight: 1 << 30}

// admissionShare is what one process reports.
type admissionShare struct {
	Grants    int       `json:"grants"`
	Denials   int       `json:"denials"`
	AcquireMS []float64 `json:"acquire_ms"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
}

// runBenchAdmission measures acquire+release on one hot pool of the
// Postgres limiter from o.producers processes with o.workers goroutines
// each, o.jobs grants in all.
func runBenchAdmission(ctx context.Context, c *common, o benchOptions, stdout, stderr io.Writer) error {
	if schema := os.Getenv(benchAdmissionChild); schema != "" {
		return benchAdmissionWorker(ctx, c, o, schema, os.Stdin, stdout)
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
	fmt.Fprintf(stderr, "llmq bench: mode=admission processes=%d workers=%d grants=%d schema=%s\n", o.producers, o.workers, o.jobs, schema)

	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	children := make([]child, o.producers)
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
			"-jobs", strconv.Itoa(max(share, 1)), "-workers", strconv.Itoa(o.workers))
		cmd.Env = append(os.Environ(), benchAdmissionChild+"="+schema)
		cmd.Stderr = stderr
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
		children[i] = child{cmd: cmd, stdin: stdin, out: bufio.NewReader(out)}
	}
	// Start together: every process connects first, then all are told to go.
	for _, ch := range children {
		if line, err := ch.out.ReadString('\n'); err != nil || line != "ready\n" {
			return fmt.Errorf("bench process did not start (it said %q): %w", line, cmp.Or(err, errors.New("unexpected output")))
		}
	}
	for _, ch := range children {
		_ = ch.stdin.Close()
	}
	var all admissionShare
	for _, ch := range children {
		var s admissionShare
		if err := json.NewDecoder(ch.out).Decode(&s); err != nil {
			return fmt.Errorf("reading a bench process's figures: %w", err)
		}
		all.Grants += s.Grants
		all.Denials += s.Denials
		all.AcquireMS = append(all.AcquireMS, s.AcquireMS...)
		if all.Start.IsZero() || s.Start.Before(all.Start) {
			all.Start = s.Start
		}
		if s.End.After(all.End) {
			all.End = s.End
		}
	}
	inFlight, permits, err := l.Counts(ctx, benchAdmissionPool.Name)
	if err != nil {
		return err
	}
	seconds := all.End.Sub(all.Start).Seconds()
	slices.Sort(all.AcquireMS)
	result := map[string]any{
		"processes": o.producers, "workers": o.workers, "grants": all.Grants, "denials": all.Denials,
		"seconds": seconds, "grants_per_s": float64(all.Grants) / seconds,
		"acquire_p50_ms": percentile(all.AcquireMS, 0.50), "acquire_p99_ms": percentile(all.AcquireMS, 0.99),
		"acquire_max_ms": percentile(all.AcquireMS, 1), "in_flight_after": inFlight, "permits_after": permits,
	}
	if c.json {
		return json.NewEncoder(stdout).Encode(result)
	}
	fmt.Fprintf(stdout, "llmq admission processes=%d workers=%d grants=%d seconds=%.3f grants_per_s=%.0f acquire_p50_ms=%.2f acquire_p99_ms=%.2f acquire_max_ms=%.2f in_flight_after=%d\n",
		o.producers, o.workers, all.Grants, seconds, result["grants_per_s"], result["acquire_p50_ms"], result["acquire_p99_ms"], result["acquire_max_ms"], inFlight)
	return nil
}

// percentile of sorted values, q in [0, 1].
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// benchAdmissionWorker is one bench process: o.jobs grants from o.workers
// goroutines, each acquire timed, each permit released as answered.
func benchAdmissionWorker(ctx context.Context, c *common, o benchOptions, schema string, start io.Reader, stdout io.Writer) error {
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(min(o.workers, 64))
	cfg.MinConns = cfg.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: schema, Holder: "bench"})
	if err != nil {
		return err
	}
	// Warm every connection so the measured phase does not pay for
	// connecting.
	var warm sync.WaitGroup
	for range cfg.MaxConns {
		warm.Go(func() { _, _ = l.State(ctx, benchAdmissionPool.Name) })
	}
	warm.Wait()
	fmt.Fprintln(stdout, "ready")
	_, _ = io.Copy(io.Discard, start) // the parent closes stdin to start everyone at once

	var (
		mu    sync.Mutex
		share = admissionShare{AcquireMS: make([]float64, 0, o.jobs)}
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
	share.Start = time.Now()
	for range o.workers {
		wg.Go(func() {
			for take() {
				t0 := time.Now()
				p, err := l.Acquire(ctx, admission.Request{Pool: benchAdmissionPool.Name, Tenant: "bench", Tokens: 500})
				d := time.Since(t0)
				if err == nil {
					err = p.Release(ctx, admission.Outcome{Result: admission.Answered, InputTokens: 300})
				}
				mu.Lock()
				switch {
				case err == nil:
					share.Grants++
					share.AcquireMS = append(share.AcquireMS, float64(d.Microseconds())/1000)
				case errors.Is(err, admission.ErrWait):
					share.Denials++
				default:
					fail = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	share.End = time.Now()
	if fail != nil {
		return fail
	}
	return json.NewEncoder(stdout).Encode(share)
}
