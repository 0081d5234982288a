package schedule

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// Config configures a Scheduler. Zero values mean the documented defaults.
type Config struct {
	// Schema is the Postgres schema llmq was migrated into. Default "llmq".
	Schema string
	// Schedules are the schedules registered in code: upserted at every
	// Run's start (spec replaced, paused and progress kept). Names must be
	// unique.
	Schedules []Schedule
	// Clock decides when slots are due. Default: real time. The lease is
	// timed by the database's clock and real time whatever Clock is.
	Clock Clock
	// LeaseDuration is how long the active scheduler's lease lasts without
	// a renewal; it renews every third of it, and a standby checks every
	// half of it. Default 10s, at least 100ms.
	LeaseDuration time.Duration
	// Tick is how often the active scheduler looks for due slots, on
	// Clock. Default 1s: a slot is enqueued within about a Tick of its
	// time (plus its jitter).
	Tick time.Duration
	// Holder names this scheduler in the lease; unique among the
	// schedulers of a schema. Default: host name, process id and a random
	// suffix.
	Holder string
	// Logger receives operational messages. Default slog.Default().
	Logger *slog.Logger
	// MeterProvider receives llmq.schedule.lag. Nil means none.
	MeterProvider metric.MeterProvider
}

// Lease bounds and defaults (Config.LeaseDuration).
const (
	DefaultLeaseDuration = 10 * time.Second
	MinLeaseDuration     = 100 * time.Millisecond
	DefaultTick          = time.Second
)

// Scheduler enqueues the due slots of the stored schedules while it holds
// the schedulers' lease. Run one per process.
type Scheduler struct {
	pool   *pgxpool.Pool
	jobs   jobs.Store
	store  *Store
	cfg    Config
	clock  Clock
	code   []string // names of cfg.Schedules
	lag    metric.Float64Histogram
	active atomic.Bool

	specsMu sync.Mutex
	specs   map[specKey]*spec // parsed timings, by what they were parsed from
}

type specKey struct {
	name, cron, zone string
	everyMS, jitter  int64
}

// NewScheduler validates cfg, every schedule of it included, before
// anything is written.
func NewScheduler(pool *pgxpool.Pool, store jobs.Store, cfg Config) (*Scheduler, error) {
	if pool == nil || store == nil {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalid, Field: "pool", Problem: "NewScheduler needs a pool and a job store"}
	}
	switch {
	case cfg.LeaseDuration < 0 || cfg.LeaseDuration > 0 && cfg.LeaseDuration < MinLeaseDuration:
		return nil, invalid("LeaseDuration", "is %s; use 0 for the default or at least %s", cfg.LeaseDuration, MinLeaseDuration)
	case cfg.Tick < 0:
		return nil, invalid("Tick", "is %s; use 0 for the default or a positive duration", cfg.Tick)
	}
	cfg.LeaseDuration = cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.Tick = cmp.Or(cfg.Tick, DefaultTick)
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = crand.Read(b[:])
		cfg.Holder = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("scheduler", cfg.Holder)
	seen := map[string]bool{}
	schedules := make([]Schedule, len(cfg.Schedules))
	for i, sc := range cfg.Schedules {
		norm, _, err := sc.normalize()
		if err != nil {
			var verr *llmqtype.ValidationError
			if errors.As(err, &verr) {
				verr.Field = fmt.Sprintf("Schedules[%d].%s", i, verr.Field)
			}
			return nil, err
		}
		if seen[norm.Name] {
			return nil, invalid(fmt.Sprintf("Schedules[%d].Name", i), "%q is registered twice", norm.Name)
		}
		seen[norm.Name] = true
		schedules[i] = norm
	}
	cfg.Schedules = schedules
	st, err := NewStore(StoreConfig{Schema: cfg.Schema, Clock: cfg.Clock})
	if err != nil {
		return nil, err
	}
	lag, err := telemetry.Meter(cfg.MeterProvider, "schedule").Float64Histogram("llmq.schedule.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from a slot to the enqueue of its job, by schedule."),
		metric.WithExplicitBucketBoundaries(telemetry.SlowBuckets...))
	if err != nil {
		return nil, fmt.Errorf("schedule: instruments: %w", err)
	}
	s := &Scheduler{pool: pool, jobs: store, store: st, cfg: cfg, clock: cfg.Clock, lag: lag, specs: map[specKey]*spec{},
		code: []string{}} // never NULL: "name = ANY (NULL)" is NULL
	for _, sc := range cfg.Schedules {
		s.code = append(s.code, sc.Name)
	}
	return s, nil
}

// Store is the scheduler's store, on its schema and clock.
func (s *Scheduler) Store() *Store { return s.store }

// Active reports whether Run currently holds the lease.
func (s *Scheduler) Active() bool { return s.active.Load() }

// Run registers the code schedules, then schedules until ctx ends: any
// number of schedulers may run on one schema, one per process; the one
// holding the lease enqueues, the others stand by and take the lease over
// when it stops renewing it. When ctx ends it releases the lease and
// returns nil.
func (s *Scheduler) Run(ctx context.Context) error {
	if s.registerRetrying(ctx) {
		s.campaign(ctx)
	}
	return nil
}

// campaign asks for the lease until ctx ends, leading while it holds it.
func (s *Scheduler) campaign(ctx context.Context) {
	standingBy := false
	for {
		epoch, expiresIn, err := s.tryAcquire(ctx)
		wait := s.standbyWait(expiresIn)
		switch {
		case epoch > 0 && ctx.Err() != nil:
			s.release(ctx, epoch)
			return
		case ctx.Err() != nil:
			return
		case err != nil:
			s.cfg.Logger.Warn("llmq: scheduler could not check the lease; trying again", "err", err, "retry_in", wait)
		case epoch > 0:
			standingBy = false
			s.lead(ctx, epoch)
			if ctx.Err() != nil {
				return
			}
		case !standingBy:
			standingBy = true
			s.cfg.Logger.Debug("llmq: scheduler standing by; another scheduler holds the lease")
		}
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// registerRetrying registers the code schedules, trying again with a
// growing pause while it fails; false when ctx ended first.
func (s *Scheduler) registerRetrying(ctx context.Context) bool {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, s.cfg.LeaseDuration) {
		err := s.register(ctx)
		switch {
		case ctx.Err() != nil:
			return false
		case err == nil:
			return true
		}
		s.cfg.Logger.Warn("llmq: scheduler could not register its schedules; trying again", "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return false
		}
	}
}

// standbyWait is how long to wait before asking for the lease again: about
// until the holder's lease expires, within half a lease and a quarter,
// less a random eighth so standbys do not ask together.
func (s *Scheduler) standbyWait(expiresIn time.Duration) time.Duration {
	poll := s.cfg.LeaseDuration / 2
	wait := min(max(expiresIn, poll/2), poll)
	return wait - rand.N(wait/8+1)
}

// register upserts the code schedules, in one transaction.
func (s *Scheduler) register(ctx context.Context) error {
	if len(s.cfg.Schedules) == 0 {
		return nil
	}
	// By name, so that schedulers starting together lock the rows in one
	// order.
	sorted := slices.SortedFunc(slices.Values(s.cfg.Schedules), func(a, b Schedule) int { return strings.Compare(a.Name, b.Name) })
	return dbsql.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		for _, sc := range sorted {
			if err := s.store.put(ctx, tx, sc, SourceCode); err != nil {
				return err
			}
		}
		return nil
	})
}

// tryAcquire takes the lease if it is free: 0 and when the holder's
// expires if not.
func (s *Scheduler) tryAcquire(ctx context.Context) (epoch int64, expiresIn time.Duration, err error) {
	checkCtx, cancel := context.WithTimeout(ctx, s.cfg.LeaseDuration)
	defer cancel()
	var (
		free      bool
		expiresMS float64
	)
	if err := s.pool.QueryRow(checkCtx, s.store.sql.leaseFree).Scan(&free, &expiresMS); err != nil {
		return 0, 0, fmt.Errorf("schedule: reading the lease: %w", err)
	}
	if !free {
		return 0, time.Duration(min(expiresMS, float64(time.Hour/time.Millisecond))) * time.Millisecond, nil
	}
	var previous *string
	err = s.pool.QueryRow(checkCtx, s.store.sql.acquireLease, s.cfg.Holder, s.cfg.LeaseDuration.Milliseconds()).Scan(&epoch, &previous)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, nil // another scheduler took it first
	}
	if err != nil {
		return 0, 0, fmt.Errorf("schedule: acquiring the lease: %w", err)
	}
	s.cfg.Logger.Info("llmq: scheduler active", "epoch", epoch, "previous", dbsql.Deref(previous))
	return epoch, 0, nil
}

// lead ticks as the active scheduler until ctx ends or the lease is lost,
// then releases the lease if it still holds it.
func (s *Scheduler) lead(ctx context.Context, epoch int64) {
	leadCtx, stepDown := context.WithCancel(ctx)
	defer stepDown()
	s.active.Store(true)
	defer s.active.Store(false)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		s.renew(leadCtx, stepDown, epoch)
	}()
	for {
		_, err := s.tick(leadCtx, epoch)
		switch {
		case leadCtx.Err() != nil:
		case errors.Is(err, errLeaseLost):
			s.cfg.Logger.Warn("llmq: scheduler lost the lease; standing by", "epoch", epoch)
			stepDown()
		case err != nil:
			s.cfg.Logger.Warn("llmq: scheduler tick failed", "err", err)
		}
		if leadCtx.Err() != nil {
			break
		}
		select {
		case <-leadCtx.Done():
		case <-s.clock.After(s.cfg.Tick):
		}
	}
	stepDown()
	<-renewing
	s.release(ctx, epoch)
}

// lease is the scheduler's lease under epoch, for leader's renewal loop and
// release.
func (s *Scheduler) lease(epoch int64) leader.Renewal {
	return leader.Renewal{
		Lease: s.cfg.LeaseDuration, Logger: s.cfg.Logger, Holder: "scheduler", What: "lease", Rival: "scheduler",
		Renew: func(ctx context.Context) (bool, error) {
			tag, err := s.pool.Exec(ctx, s.store.sql.renewLease, s.cfg.Holder, epoch, s.cfg.LeaseDuration.Milliseconds())
			return tag.RowsAffected() > 0, err
		},
		Free: func(ctx context.Context) error {
			_, err := s.pool.Exec(ctx, s.store.sql.releaseLease, s.cfg.Holder, epoch)
			return err
		},
	}
}

// renew extends the lease every third of LeaseDuration and steps down when
// another scheduler took it, or when no renewal succeeded for a whole
// lease.
func (s *Scheduler) renew(ctx context.Context, stepDown context.CancelFunc, epoch int64) {
	s.lease(epoch).Keep(ctx, stepDown, epoch)
}

// release frees the lease for the next standby's check, after ctx ended.
func (s *Scheduler) release(ctx context.Context, epoch int64) { s.lease(epoch).Release(ctx, epoch) }

// errLeaseLost: the tick's transaction found the lease no longer this
// scheduler's epoch, and wrote nothing.
var errLeaseLost = errors.New("schedule: lease lost")

// tick enqueues the due slots of every due schedule, each schedule in a
// transaction of its own, and returns how many jobs it created.
func (s *Scheduler) tick(ctx context.Context, epoch int64) (int, error) {
	now := s.clock.Now()
	rows, err := s.pool.Query(ctx, s.store.sql.dueSchedules, now, s.code)
	if err != nil {
		return 0, fmt.Errorf("schedule: reading due schedules: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("schedule: reading due schedules: %w", err)
	}
	var (
		created int
		errs    []error
	)
	for _, name := range names {
		n, err := s.fire(ctx, epoch, name, now)
		created += n
		if errors.Is(err, errLeaseLost) || ctx.Err() != nil {
			return created, err
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("schedule %q: %w", name, err))
		}
	}
	return created, errors.Join(errs...)
}

// fire enqueues one schedule's due slots and advances it, in one
// transaction fenced by the lease.
func (s *Scheduler) fire(ctx context.Context, epoch int64, name string, now time.Time) (int, error) {
	type enqueued struct {
		slot time.Time
		new  bool
	}
	var done []enqueued
	err := dbsql.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		done = nil
		var held int64
		if err := tx.QueryRow(ctx, s.store.sql.holdLease, s.cfg.Holder, epoch).Scan(&held); errors.Is(err, pgx.ErrNoRows) {
			return errLeaseLost
		} else if err != nil {
			return err
		}
		var r dueRow
		if err := tx.QueryRow(ctx, s.store.sql.lockDue, name, now).Scan(r.dest()...); errors.Is(err, pgx.ErrNoRows) {
			return nil // paused, deleted or advanced since DueSchedules
		} else if err != nil {
			return err
		}
		sp, err := s.spec(name, &r.specRow)
		if err != nil {
			// Only SQL written by hand stores a spec Put refuses.
			s.cfg.Logger.Error("llmq: stored schedule cannot be read; it waits until it is repaired", "schedule", name, "err", err)
			return nil
		}
		slots, after := sp.due(r.nextSlot, now, max(r.catchUpMax, 1))
		var nextSlot *time.Time
		if !after.IsZero() {
			nextSlot = &after
		}
		if len(slots) == 0 {
			if after.Equal(r.nextSlot) {
				return nil // the slot waits for its jitter
			}
			_, err := tx.Exec(ctx, s.store.sql.advanceSchedule, name, nextSlot, nil, pgtype.UUID{}, now)
			return err
		}
		base := r.schedule(name).Job
		params := make([]jobs.EnqueueParams, len(slots))
		for i, slot := range slots {
			p := base
			p.IdempotencyKey = SlotKey(name, slot)
			// The slot, not the spec: a slot replayed after its schedule's
			// job changed finds its job rather than a conflict.
			p.RequestHash, err = jobs.RequestHash(p.IdempotencyKey)
			if err != nil {
				return err
			}
			params[i] = p
		}
		results, err := s.jobs.EnqueueMany(ctx, tx, params)
		var verr *llmqtype.ValidationError
		if errors.As(err, &verr) {
			// Refused before anything was written (an unknown queue, a
			// payload over the store's limit): every retry would be
			// refused too, so the slots are skipped.
			s.cfg.Logger.Error("llmq: the job store refused a schedule's job; its due slots are skipped", "schedule", name, "err", err)
			_, err := tx.Exec(ctx, s.store.sql.advanceSchedule, name, nextSlot, nil, pgtype.UUID{}, now)
			return err
		}
		if err != nil {
			return err
		}
		last := slots[len(slots)-1]
		lastJob := dbsql.UUID(results[len(results)-1].Job.ID)
		if _, err := tx.Exec(ctx, s.store.sql.advanceSchedule, name, nextSlot, &last, lastJob, now); err != nil {
			return err
		}
		for i, res := range results {
			done = append(done, enqueued{slots[i], !res.Existing})
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	created := 0
	for _, e := range done {
		if e.new {
			created++
			s.lag.Record(ctx, now.Sub(e.slot).Seconds(), metric.WithAttributes(attribute.String("schedule", name)))
		}
	}
	return created, nil
}

// spec parses a stored timing, once per distinct timing.
func (s *Scheduler) spec(name string, r *specRow) (*spec, error) {
	key := specKey{name: name, cron: dbsql.Deref(r.cron), zone: r.timeZone, everyMS: dbsql.Deref(r.everyMS), jitter: r.jitterMS}
	s.specsMu.Lock()
	defer s.specsMu.Unlock()
	if sp, ok := s.specs[key]; ok {
		return sp, nil
	}
	sp, err := r.spec(name)
	if err != nil {
		return nil, err
	}
	if len(s.specs) > 10_000 {
		clear(s.specs)
	}
	s.specs[key] = sp
	return sp, nil
}
