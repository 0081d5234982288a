package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// Clock is the time a scheduler and a store compute slots with. The
// default is the real clock; tests pass one they advance.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed on this
	// clock.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Source says who owns a stored schedule.
type Source string

const (
	// SourceCode marks a schedule registered in code (Config.Schedules), upserted by every
	// scheduler at start.
	SourceCode Source = "code"
	// SourceOperator marks a schedule written with Store.Put.
	SourceOperator Source = "operator"
)

// Status is a stored schedule with its progress.
type Status struct {
	Schedule
	Paused bool
	Source Source
	// NextSlot is the next slot to enqueue (zero: the cron has no further
	// slot); while paused, the slot Resume replaces.
	NextSlot time.Time
	// LastSlot is the latest slot enqueued, LastJob its job and
	// LastEnqueuedAt when (the scheduler's clock); zero before the first.
	LastSlot       time.Time
	LastJob        uuid.UUID
	LastEnqueuedAt time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema is the Postgres schema llmq was migrated into. Default "llmq".
	Schema string
	// Clock computes the first slot of a schedule put or resumed. Default:
	// real time.
	Clock Clock
}

// Store reads and writes stored schedules. It holds no connections and is
// safe for concurrent use.
type Store struct {
	clock Clock
	sql   statements
}

// NewStore prepares the store's SQL for its schema.
func NewStore(cfg StoreConfig) (*Store, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	s := &Store{clock: cfg.Clock}
	if s.clock == nil {
		s.clock = realClock{}
	}
	if _, err := s.sql.load(schema); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	return s, nil
}

// Put stores an operator's schedule, or replaces the spec of the
// operator's schedule of its name; paused and the progress are kept, and
// the next slot is recomputed (the first after now) only when Cron, Every
// or TimeZone changed. A bad schedule is refused with a
// *llmqtype.ValidationError naming the field before anything is written;
// a name a code schedule holds with ErrCodeOwned.
func (s *Store) Put(ctx context.Context, db llmqtype.DBTX, sc Schedule) error {
	return s.put(ctx, db, sc, SourceOperator)
}

func (s *Store) put(ctx context.Context, db llmqtype.DBTX, sc Schedule, source Source) error {
	sc, sp, err := sc.normalize()
	if err != nil {
		return err
	}
	var name string
	err = db.QueryRow(ctx, s.sql.putSchedule, s.args(sc, sp, source)...).Scan(&name)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q", ErrCodeOwned, sc.Name)
	case err != nil:
		return fmt.Errorf("schedule: storing %q: %w", sc.Name, err)
	}
	return nil
}

func (s *Store) args(sc Schedule, sp *spec, source Source) []any {
	var next *time.Time
	if n := sp.next(s.clock.Now()); !n.IsZero() {
		next = &n
	}
	j := sc.Job
	return []any{sc.Name, dbsql.NullIfZero(sc.Cron), dbsql.NullIfZero(int64(sc.Every / time.Millisecond)), sc.TimeZone,
		int64(sc.Jitter / time.Millisecond), string(sc.Misfire), max(sc.CatchUpMax, 1),
		j.Tenant, j.Kind, j.Queue, j.Priority, string(j.Payload), j.GroupKey, j.MaxAttempts, j.EstimatedTokens,
		next, string(source)}
}

// Delete removes the schedule; ErrNotFound if there is none. A code
// schedule comes back at the next scheduler start that registers it.
func (s *Store) Delete(ctx context.Context, db llmqtype.DBTX, name string) error {
	return s.byName(ctx, db, s.sql.deleteSchedule, name, "deleting")
}

// Pause stops the schedule's slots from being enqueued until Resume;
// ErrNotFound if there is none.
func (s *Store) Pause(ctx context.Context, db llmqtype.DBTX, name string) error {
	return s.byName(ctx, db, s.sql.pauseSchedule, name, "pausing")
}

func (s *Store) byName(ctx context.Context, db llmqtype.DBTX, sql, name, doing string) error {
	var got string
	err := db.QueryRow(ctx, sql, name).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	case err != nil:
		return fmt.Errorf("schedule: %s %q: %w", doing, name, err)
	}
	return nil
}

// Resume enqueues the schedule's slots again from the first slot after
// now: the slots that came while it was paused are not enqueued. Resuming
// a schedule that is not paused changes nothing; ErrNotFound if there is
// none.
func (s *Store) Resume(ctx context.Context, db llmqtype.DBTX, name string) error {
	beginner, ok := db.(dbsql.Beginner)
	if !ok {
		return fmt.Errorf("schedule: resuming %q: db cannot begin a transaction", name)
	}
	err := dbsql.WithTx(ctx, beginner, func(tx pgx.Tx) error {
		var (
			r      specRow
			paused bool
		)
		err := tx.QueryRow(ctx, s.sql.lockForResume, name).Scan(&r.cron, &r.everyMS, &r.timeZone, &r.jitterMS, &paused)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		if err != nil || !paused {
			return err
		}
		sp, err := r.spec(name)
		if err != nil {
			return err
		}
		var next *time.Time
		if n := sp.next(s.clock.Now()); !n.IsZero() {
			next = &n
		}
		_, err = tx.Exec(ctx, s.sql.resumeSchedule, name, next)
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("schedule: resuming %q: %w", name, err)
	}
	return err
}

// List returns every stored schedule, by name, with its next and last
// slots.
func (s *Store) List(ctx context.Context, db llmqtype.DBTX) ([]Status, error) {
	return s.list(ctx, db, nil)
}

// Get returns the stored schedule; ErrNotFound if there is none.
func (s *Store) Get(ctx context.Context, db llmqtype.DBTX, name string) (Status, error) {
	got, err := s.list(ctx, db, &name)
	if err != nil {
		return Status{}, err
	}
	if len(got) == 0 {
		return Status{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return got[0], nil
}

func (s *Store) list(ctx context.Context, db llmqtype.DBTX, name *string) ([]Status, error) {
	rows, err := db.Query(ctx, s.sql.listSchedules, name)
	if err != nil {
		return nil, fmt.Errorf("schedule: listing: %w", err)
	}
	got, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (Status, error) {
		var r row
		if err := cr.Scan(r.dest()...); err != nil {
			return Status{}, err
		}
		st := Status{
			Schedule: r.schedule(r.name), Paused: r.paused, Source: Source(r.source),
			NextSlot: dbsql.Deref(r.nextSlot), LastSlot: dbsql.Deref(r.lastSlot), LastEnqueuedAt: dbsql.Deref(r.lastEnqueuedAt),
			CreatedAt: r.createdAt, UpdatedAt: r.updatedAt,
		}
		if r.lastJob.Valid {
			st.LastJob = r.lastJob.Bytes
		}
		return st, nil
	})
	if err != nil {
		return nil, fmt.Errorf("schedule: listing: %w", err)
	}
	return got, nil
}

// schedule is the stored spec as a Schedule.
func (r *specRow) schedule(name string) Schedule {
	sc := Schedule{
		Name: name, Cron: dbsql.Deref(r.cron), Every: time.Duration(dbsql.Deref(r.everyMS)) * time.Millisecond,
		TimeZone: r.timeZone, Jitter: time.Duration(r.jitterMS) * time.Millisecond,
		Misfire: MisfirePolicy(r.misfire), CatchUpMax: r.catchUpMax,
		Job: jobs.EnqueueParams{Tenant: r.tenant, Kind: r.kind, Queue: r.queue, Priority: r.priority,
			Payload: r.payload, GroupKey: r.groupKey, MaxAttempts: r.maxAttempts, EstimatedTokens: r.estimatedTokens},
	}
	if sc.Every != 0 {
		sc.TimeZone = ""
	}
	if sc.Misfire == MisfireSkip {
		sc.CatchUpMax = 0
	}
	return sc
}

// spec parses the stored timing.
func (r *specRow) spec(name string) (*spec, error) {
	zone := r.timeZone
	if r.everyMS != nil {
		zone = ""
	}
	return parseSpec(name, dbsql.Deref(r.cron), time.Duration(dbsql.Deref(r.everyMS))*time.Millisecond, zone,
		time.Duration(r.jitterMS)*time.Millisecond)
}
