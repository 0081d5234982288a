package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/retention"
)

// isSoak tells whether bench's arguments ask for -mode soak, which has
// flags of its own.
func isSoak(args []string) bool {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == "mode=soak" || (a == "mode" && i+1 < len(args) && args[i+1] == "soak" && strings.HasPrefix(args[i], "-")) {
			return true
		}
	}
	return false
}

type soakOptions struct {
	duration  time.Duration
	rate      float64
	retention time.Duration
	workers   int
	sample    time.Duration
	keep      bool
}

// runBenchSoak is llmq bench -mode soak: open-loop arrivals at -rate
// through a runner, a relay (to a broker that drops what it is given) and
// the retention service for -duration, printing every -sample the
// completion rate, the pickup p99, the size of every llmq table and index,
// dead tuples and WAL bytes per job, then one summary line.
func runBenchSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("bench", stderr)
	var o soakOptions
	fs.String("mode", "soak", "soak: open-loop arrivals through runners, relay and retention (see llmq bench -h for the other modes)")
	fs.DurationVar(&o.duration, "duration", 30*time.Minute, "how long arrivals run")
	fs.Float64Var(&o.rate, "rate", 500, "arrivals per second")
	ret := &retentionFlag{target: &o.retention}
	o.retention = 5 * time.Minute
	fs.Var(ret, "retention", `how long finished jobs and published events are kept (the idempotency window too); "never" runs no retention service, for a baseline`)
	fs.IntVar(&o.workers, "workers", 100, "runner concurrency")
	fs.DurationVar(&o.sample, "sample", time.Minute, "time between reports (at most a third of -duration is used)")
	fs.BoolVar(&o.keep, "keep", false, "keep the throwaway schema instead of dropping it")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case o.duration < 3*time.Second:
		return fmt.Errorf("%w: -duration %s: at least 3s (three thirds of at least a second)", errUsage, o.duration)
	case o.rate <= 0 || o.rate > 100_000:
		return fmt.Errorf("%w: -rate %g: use more than 0 and at most 100000", errUsage, o.rate)
	case o.workers < 1 || o.sample <= 0:
		return fmt.Errorf("%w: -workers and -sample must be positive", errUsage)
	case c.json:
		return fmt.Errorf("%w: -json: -mode soak prints key=value lines only", errUsage)
	}
	o.sample = min(o.sample, o.duration/3)
	pool, err := c.connectBench(ctx, benchOptions{producers: 48})
	if err != nil {
		return err
	}
	defer pool.Close()
	schema, drop, err := throwawaySchema(ctx, pool, o.keep, stderr)
	if err != nil {
		return err
	}
	defer drop()
	// Retention deletes rows; only vacuum makes their space reusable. A
	// server with autovacuum off (as some CI servers run) grows whatever
	// retention does, so the soak says which kind of server it measured.
	var autovacuum string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&autovacuum); err != nil {
		return fmt.Errorf("reading the server's autovacuum setting: %w", err)
	}
	fmt.Fprintf(stderr, "llmq bench: mode=soak duration=%s rate=%g retention=%s workers=%d autovacuum=%s schema=%s\n",
		o.duration, o.rate, retention.FormatRetention(o.retention), o.workers, autovacuum, schema)
	if autovacuum != "on" {
		fmt.Fprintln(stderr, "llmq bench: warning: autovacuum is off on this server: dead rows are never reclaimed, so every table grows "+
			"and claims slow down whatever retention deletes. A deployment runs with autovacuum on; measure on such a server "+
			"(ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf()).")
	}
	s := &soak{o: o, pool: pool, schema: schema, out: stdout, log: slog.New(slog.NewTextHandler(&lockedWriter{w: stderr}, nil))}
	return s.run(ctx)
}

type soak struct {
	o      soakOptions
	pool   *pgxpool.Pool
	schema string
	out    io.Writer
	log    *slog.Logger

	completed atomic.Int64
	thirdDone [3]atomic.Int64 // completions per third of the run
	mu        sync.Mutex
	sampleLat latencyHist    // pickups since the last report
	thirdLat  [3]latencyHist // fixed size: memory does not grow with the run
	start     time.Time
}

// droppingPublisher confirms everything and keeps nothing: the soak
// measures the database, not a broker.
type droppingPublisher struct{}

func (droppingPublisher) Publish(context.Context, []broker.Message) error { return nil }
func (droppingPublisher) Close() error                                    { return nil }

func (s *soak) run(ctx context.Context) error {
	store, err := jobs.NewStore(jobs.Config{Schema: s.schema})
	if err != nil {
		return err
	}
	events, err := outbox.NewStore(outbox.Config{Schema: s.schema})
	if err != nil {
		return err
	}
	// With -retention never, nothing prunes: neither the retention service
	// (not run) nor the relay (a retention longer than any run).
	keep, interval := s.o.retention, min(max(s.o.retention/10, time.Second), time.Minute)
	if keep == retention.Never {
		keep, interval = 100*365*24*time.Hour, time.Minute
	}
	relay, err := events.NewRelay(s.pool, droppingPublisher{}, outbox.RelayConfig{ID: "soak-relay", Retention: keep, PruneInterval: interval, Logger: s.log})
	if err != nil {
		return err
	}
	services := []func(context.Context) error{relay.Run}
	if s.o.retention != retention.Never {
		pruner, err := retention.New(s.pool, retention.Config{
			Schema: s.schema, ID: "soak-retention", Interval: interval, Logger: s.log,
			Policy: retention.Policy{Succeeded: keep, IdempotencyWindow: keep, PublishedEvents: keep},
		})
		if err != nil {
			return err
		}
		services = append(services, pruner.Run)
	}
	runner, err := lease.NewRunner(s.pool, store, lease.Config{
		Handlers: map[string]lease.Handler{benchKind: lease.HandlerFunc(func(_ context.Context, job *jobs.Job) (json.RawMessage, error) {
			s.picked(time.Since(job.CreatedAt))
			return nil, nil
		})},
		Queues:     map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: s.o.workers}},
		ClaimBatch: 10,
		Logger:     s.log,
		AfterRecord: func(job *jobs.Job, err error) {
			if err == nil && job.State == jobs.StateSucceeded {
				s.completed.Add(1)
				s.thirdDone[s.third()].Add(1)
			}
		},
	})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, svc := range append(services, runner.Run) {
		wg.Go(func() {
			if err := svc(runCtx); err != nil {
				errs <- err
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()

	s.start = time.Now()
	producerErr := make(chan error, 1)
	wg.Go(func() { producerErr <- s.produce(runCtx, store) })
	err = s.report(ctx)
	cancel()
	wg.Wait()
	close(errs)
	return errors.Join(err, <-producerErr, <-errs)
}

// picked records one pickup latency, for the current report and its third
// of the run.
func (s *soak) picked(d time.Duration) {
	third := s.third()
	s.mu.Lock()
	s.sampleLat.add(d)
	if third != 1 {
		s.thirdLat[third].add(d)
	}
	s.mu.Unlock()
}

// third is the third of the run now is in (the end counts in the last).
func (s *soak) third() int { return min(int(3*time.Since(s.start)/s.o.duration), 2) }

// produce enqueues one job per transaction at the arrival rate, whatever
// the completions do (open loop), until the duration is up.
func (s *soak) produce(ctx context.Context, store *jobs.PostgresStore) error {
	interval := time.Duration(float64(time.Second) / s.o.rate)
	inFlight := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	defer wg.Wait()
	for i := 0; ; i++ {
		at := s.start.Add(time.Duration(i) * interval)
		if at.Sub(s.start) >= s.o.duration || !sleepUntil(ctx, at) {
			break
		}
		if e := failed.Load(); e != nil {
			return *e
		}
		select {
		case inFlight <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		wg.Go(func() {
			defer func() { <-inFlight }()
			if _, err := store.Enqueue(ctx, s.pool, jobs.EnqueueParams{Tenant: "soak", Kind: benchKind, Payload: []byte(`{"n":1}`)}); err != nil && ctx.Err() == nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	return nil
}

// sizes reads every llmq relation's size (tables, indexes, TOAST) and the
// tables' dead tuples.
func (s *soak) sizes(ctx context.Context) (map[string]int64, int64, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT c.relname, pg_relation_size(c.oid), coalesce(st.n_dead_tup, 0)
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'i', 't')
		UNION ALL
		SELECT 'toast:' || c.relname, pg_total_relation_size(c.reltoastrelid), 0
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND c.reltoastrelid <> 0`, s.schema)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	out := map[string]int64{}
	var dead int64
	for rows.Next() {
		var name string
		var size, d int64
		if err := rows.Scan(&name, &size, &d); err != nil {
			return nil, 0, err
		}
		if size > 0 {
			out[name] = size
		}
		dead += d
	}
	return out, dead, rows.Err()
}

func total(sizes map[string]int64) int64 {
	var n int64
	for _, v := range sizes {
		n += v
	}
	return n
}

func (s *soak) wal(ctx context.Context) (int64, error) {
	var lsn int64
	err := s.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&lsn)
	return lsn, err
}

// report prints a line per sample until the duration is up, then the
// summary line.
func (s *soak) report(ctx context.Context) error {
	lastWAL, err := s.wal(ctx)
	if err != nil {
		return err
	}
	var lastDone int64
	var twoThirdsSize int64
	lastAt := s.start
	for n := 1; ; n++ {
		at := s.start.Add(time.Duration(n) * s.o.sample)
		end := !at.Before(s.start.Add(s.o.duration))
		if end {
			at = s.start.Add(s.o.duration)
		}
		if !sleepUntil(ctx, at) {
			return ctx.Err()
		}
		done := s.completed.Load()
		wal, err := s.wal(ctx)
		if err != nil {
			return err
		}
		sizes, dead, err := s.sizes(ctx)
		if err != nil {
			return err
		}
		s.mu.Lock()
		p99 := s.sampleLat.p99ms()
		s.sampleLat = latencyHist{}
		s.mu.Unlock()
		var mem runtime.MemStats
		runtime.ReadMemStats(&mem)
		secs := time.Since(lastAt).Seconds()
		perJob := 0.0
		if done > lastDone {
			perJob = float64(wal-lastWAL) / float64(done-lastDone)
		}
		fmt.Fprintf(s.out, "llmq soak t=%s completed_per_s=%.1f pickup_p99_ms=%.1f wal_bytes_per_job=%.0f dead_tuples=%d total_bytes=%d bench_heap_bytes=%d\n",
			time.Since(s.start).Round(time.Second), float64(done-lastDone)/secs, p99, perJob, dead, total(sizes), mem.HeapAlloc)
		names := make([]string, 0, len(sizes))
		for name := range sizes {
			names = append(names, name)
		}
		slices.Sort(names)
		var line strings.Builder
		for _, name := range names {
			if strings.HasPrefix(name, "toast:") && sizes[name] <= 8192 {
				continue // an empty TOAST table and its index
			}
			fmt.Fprintf(&line, " %s=%d", name, sizes[name])
		}
		fmt.Fprintf(s.out, "llmq soak sizes%s\n", line.String())
		if twoThirdsSize == 0 && time.Since(s.start) >= 2*s.o.duration/3 {
			twoThirdsSize = total(sizes)
		}
		lastDone, lastWAL, lastAt = done, wal, time.Now()
		if end {
			return s.summary(twoThirdsSize, total(sizes))
		}
	}
}

// summary prints the last line: the first and last thirds' completion
// rates and pickup p99s, and how much all llmq relations grew over the
// last third.
func (s *soak) summary(twoThirdsSize, endSize int64) error {
	s.mu.Lock()
	first, last := s.thirdLat[0].p99ms(), s.thirdLat[2].p99ms()
	s.mu.Unlock()
	third := s.o.duration.Seconds() / 3
	growth := 0.0
	if twoThirdsSize > 0 {
		growth = 100 * float64(endSize-twoThirdsSize) / float64(twoThirdsSize)
	}
	_, err := fmt.Fprintf(s.out, "llmq soak minutes=%g rate=%g first_per_s=%.1f last_per_s=%.1f first_p99_ms=%.1f last_p99_ms=%.1f growth_pct=%.1f\n",
		s.o.duration.Minutes(), s.o.rate, float64(s.thirdDone[0].Load())/third, float64(s.thirdDone[2].Load())/third, first, last, growth)
	return err
}
