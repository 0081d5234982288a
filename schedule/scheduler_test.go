package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/schedule"
)

// fakeClock is a Clock the test sets; After fires when the clock is set
// past it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
	afters  int // After calls so far
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock(now time.Time) *fakeClock { return &fakeClock{now: now} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.afters++
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	return ch
}

// Set moves the clock to now and fires the waits it passed.
func (c *fakeClock) Set(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
	c.waiters = slices.DeleteFunc(c.waiters, func(w waiter) bool {
		if w.at.After(now) {
			return false
		}
		w.ch <- now
		return true
	})
}

func (c *fakeClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

func (c *fakeClock) Afters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.afters
}

type fixture struct {
	db    *dbtest.DB
	jobs  *jobs.PostgresStore
	clock *fakeClock
}

func setup(t *testing.T, start time.Time) *fixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 8})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema})
	require.NoError(t, err)
	return &fixture{db: db, jobs: store, clock: newFakeClock(start)}
}

func (f *fixture) scheduler(t *testing.T, cfg schedule.Config) *schedule.Scheduler {
	t.Helper()
	cfg.Schema = f.db.Schema
	if cfg.Clock == nil {
		cfg.Clock = f.clock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := schedule.NewScheduler(f.db.Pool, f.jobs, cfg)
	require.NoError(t, err)
	return s
}

// keys are the idempotency keys of the tenant's jobs, in slot order.
func (f *fixture) keys(t *testing.T) []string {
	t.Helper()
	rows, err := f.db.Pool.Query(t.Context(),
		fmt.Sprintf("SELECT idempotency_key FROM %s.jobs WHERE tenant = 'acme' ORDER BY idempotency_key", f.db.Schema))
	require.NoError(t, err)
	var keys []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	return keys
}

// acquire makes s the active scheduler and returns its epoch.
func acquire(t *testing.T, s *schedule.Scheduler) int64 {
	t.Helper()
	require.NoError(t, s.Register(t.Context()))
	epoch, err := s.Acquire(t.Context())
	require.NoError(t, err)
	require.Positive(t, epoch)
	return epoch
}

func keysOf(name string, slots ...string) []string {
	var keys []string
	for _, s := range slots {
		keys = append(keys, "schedule:"+name+":"+s)
	}
	return keys
}

var t0 = time.Date(2026, 1, 5, 9, 59, 30, 0, time.UTC)

func everyMinute(name string, misfire schedule.MisfirePolicy, catchUp int) schedule.Schedule {
	return schedule.Schedule{Name: name, Every: time.Minute, Misfire: misfire, CatchUpMax: catchUp, Job: job}
}

// The active scheduler enqueues each slot once, when its time has come; a
// replayed tick enqueues nothing more; a new scheduler on the same schema
// (a restart) carries on from the next slot.
func TestSlotsAcrossARestart(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	s := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{everyMinute("minutely", "", 0)}})
	epoch := acquire(t, s)

	n, err := s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Zero(t, n, "no slot before 10:00")
	for range 3 {
		f.clock.Advance(time.Minute)
		n, err := s.TickOnce(t.Context(), epoch)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = s.TickOnce(t.Context(), epoch)
		require.NoError(t, err)
		require.Zero(t, n, "a replayed tick enqueues nothing")
	}
	require.Equal(t, keysOf("minutely", "2026-01-05T10:00:00Z", "2026-01-05T10:01:00Z", "2026-01-05T10:02:00Z"), f.keys(t))

	// The restart: the old scheduler's lease is released, a new one
	// registers the same schedule (keeping its progress) and takes over.
	_, err = f.db.Pool.Exec(t.Context(), fmt.Sprintf("UPDATE %s.schedule_lease SET lease_until = '-infinity'", f.db.Schema))
	require.NoError(t, err)
	s2 := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{everyMinute("minutely", "", 0)}})
	epoch2 := acquire(t, s2)
	require.Greater(t, epoch2, epoch)
	n, err = s2.TickOnce(t.Context(), epoch2)
	require.NoError(t, err)
	require.Zero(t, n)
	f.clock.Advance(time.Minute)
	n, err = s2.TickOnce(t.Context(), epoch2)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, f.keys(t), 4)

	st, err := s2.Store().Get(t.Context(), f.db.Pool, "minutely")
	require.NoError(t, err)
	require.Equal(t, schedule.SourceCode, st.Source)
	require.Equal(t, time.Date(2026, 1, 5, 10, 3, 0, 0, time.UTC), st.LastSlot.UTC())
	require.Equal(t, time.Date(2026, 1, 5, 10, 4, 0, 0, time.UTC), st.NextSlot.UTC())
	require.NotZero(t, st.LastJob)
	job, err := f.jobs.Get(t.Context(), f.db.Pool, "acme", st.LastJob)
	require.NoError(t, err)
	require.Equal(t, "schedule:minutely:2026-01-05T10:03:00Z", job.IdempotencyKey)
	require.Equal(t, "report.nightly", job.Kind)
}

// After downtime, MisfireSkip enqueues the latest due slot only;
// MisfireCatchUp the latest CatchUpMax, oldest first.
func TestMisfireAfterDowntime(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	s := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{
		everyMinute("skip", schedule.MisfireSkip, 0),
		everyMinute("catchup", schedule.MisfireCatchUp, 3),
	}})
	epoch := acquire(t, s)
	f.clock.Set(time.Date(2026, 1, 5, 10, 9, 45, 0, time.UTC)) // slots 10:00 to 10:09 due
	n, err := s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, append(
		keysOf("catchup", "2026-01-05T10:07:00Z", "2026-01-05T10:08:00Z", "2026-01-05T10:09:00Z"),
		keysOf("skip", "2026-01-05T10:09:00Z")...), f.keys(t))
	for _, name := range []string{"skip", "catchup"} {
		st, err := s.Store().Get(t.Context(), f.db.Pool, name)
		require.NoError(t, err)
		require.Equal(t, time.Date(2026, 1, 5, 10, 10, 0, 0, time.UTC), st.NextSlot.UTC(), name)
	}
}

// A paused schedule enqueues nothing; Resume does not enqueue the slots
// that came while it was paused, and carries on from the first slot after
// now.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	s := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{everyMinute("minutely", schedule.MisfireCatchUp, 100)}})
	epoch := acquire(t, s)
	store := s.Store()
	require.NoError(t, store.Pause(t.Context(), f.db.Pool, "minutely"))
	f.clock.Advance(5 * time.Minute) // 10:04:30
	n, err := s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Zero(t, n)

	require.NoError(t, store.Resume(t.Context(), f.db.Pool, "minutely"))
	st, err := store.Get(t.Context(), f.db.Pool, "minutely")
	require.NoError(t, err)
	require.False(t, st.Paused)
	require.Equal(t, time.Date(2026, 1, 5, 10, 5, 0, 0, time.UTC), st.NextSlot.UTC())
	n, err = s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Zero(t, n, "the paused slots are not caught up")
	f.clock.Advance(time.Minute)
	n, err = s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, keysOf("minutely", "2026-01-05T10:05:00Z"), f.keys(t))

	require.NoError(t, store.Resume(t.Context(), f.db.Pool, "minutely"), "resuming a running schedule changes nothing")
	require.ErrorIs(t, store.Pause(t.Context(), f.db.Pool, "nope"), schedule.ErrNotFound)
	require.ErrorIs(t, store.Resume(t.Context(), f.db.Pool, "nope"), schedule.ErrNotFound)
}

// Operator schedules: Put, List, Delete; a code schedule's name is not
// the operator's; a spec change moves the next slot, the same spec keeps
// it.
func TestOperatorSchedules(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	s := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{everyMinute("code", "", 0)}})
	epoch := acquire(t, s)
	store := s.Store()
	hourly := schedule.Schedule{Name: "ops", Cron: "@hourly", Job: job}
	require.NoError(t, store.Put(t.Context(), f.db.Pool, hourly))
	require.ErrorIs(t, store.Put(t.Context(), f.db.Pool, schedule.Schedule{Name: "code", Cron: "@hourly", Job: job}), schedule.ErrCodeOwned)
	require.ErrorIs(t, store.Put(t.Context(), f.db.Pool, schedule.Schedule{Name: "bad", Cron: "nope", Job: job}), schedule.ErrInvalid)

	list, err := store.List(t.Context(), f.db.Pool)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "code", list[0].Name)
	require.Equal(t, "ops", list[1].Name)
	require.Equal(t, schedule.SourceOperator, list[1].Source)
	require.Equal(t, "@hourly", list[1].Cron)
	require.Equal(t, time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC), list[1].NextSlot.UTC())

	f.clock.Set(time.Date(2026, 1, 5, 10, 0, 1, 0, time.UTC))
	n, err := s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	// The same spec again keeps the progress; another timing moves it.
	require.NoError(t, store.Put(t.Context(), f.db.Pool, hourly))
	st, err := store.Get(t.Context(), f.db.Pool, "ops")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 5, 11, 0, 0, 0, time.UTC), st.NextSlot.UTC())
	require.NoError(t, store.Put(t.Context(), f.db.Pool, schedule.Schedule{Name: "ops", Cron: "30 * * * *", Job: job}))
	st, err = store.Get(t.Context(), f.db.Pool, "ops")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 5, 10, 30, 0, 0, time.UTC), st.NextSlot.UTC())

	require.NoError(t, store.Delete(t.Context(), f.db.Pool, "ops"))
	require.ErrorIs(t, store.Delete(t.Context(), f.db.Pool, "ops"), schedule.ErrNotFound)
	_, err = store.Get(t.Context(), f.db.Pool, "ops")
	require.ErrorIs(t, err, schedule.ErrNotFound)
}

// A scheduler whose lease another took over writes nothing: no job, no
// progress.
func TestStaleLeaderWritesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	cfg := schedule.Config{Schedules: []schedule.Schedule{everyMinute("minutely", "", 0)}}
	stale := f.scheduler(t, cfg)
	staleEpoch := acquire(t, stale)
	// Its lease expires (it paused, or lost the database) and another
	// scheduler takes it over.
	_, err := f.db.Pool.Exec(t.Context(), fmt.Sprintf("UPDATE %s.schedule_lease SET lease_until = now() - interval '1 second'", f.db.Schema))
	require.NoError(t, err)
	leader := f.scheduler(t, cfg)
	epoch := acquire(t, leader)

	f.clock.Advance(time.Minute)
	n, err := stale.TickOnce(t.Context(), staleEpoch)
	require.ErrorIs(t, err, schedule.ErrLeaseLost)
	require.Zero(t, n)
	require.Empty(t, f.keys(t))
	st, err := leader.Store().Get(t.Context(), f.db.Pool, "minutely")
	require.NoError(t, err)
	require.Zero(t, st.LastSlot)

	n, err = leader.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// A cron in a zone follows robfig/cron at DST changes: in Europe/Berlin a
// daily 02:30 slot does not exist on the spring-forward day (none is
// enqueued) and exists twice on the fall-back day (two are, an hour
// apart).
func TestCronAcrossDST(t *testing.T) {
	t.Parallel()
	f := setup(t, time.Date(2026, 3, 27, 12, 0, 0, 0, time.UTC))
	s := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{
		{Name: "berlin", Cron: "30 2 * * *", TimeZone: "Europe/Berlin", Job: job},
	}})
	epoch := acquire(t, s)
	tickHourlyUntil := func(end time.Time) {
		for f.clock.Now().Before(end) {
			f.clock.Advance(15 * time.Minute)
			_, err := s.TickOnce(t.Context(), epoch)
			require.NoError(t, err)
		}
	}
	tickHourlyUntil(time.Date(2026, 3, 31, 12, 0, 0, 0, time.UTC))
	// 28 March 02:30 CET; 29 March (02:00 CET jumps to 03:00 CEST) none;
	// then 02:30 CEST.
	require.Equal(t, keysOf("berlin", "2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"), f.keys(t))

	f.clock.Set(time.Date(2026, 10, 23, 12, 0, 0, 0, time.UTC))
	require.NoError(t, s.Store().Pause(t.Context(), f.db.Pool, "berlin"))
	require.NoError(t, s.Store().Resume(t.Context(), f.db.Pool, "berlin"))
	_, err := f.db.Pool.Exec(t.Context(), fmt.Sprintf("DELETE FROM %s.jobs", f.db.Schema))
	require.NoError(t, err)
	tickHourlyUntil(time.Date(2026, 10, 26, 12, 0, 0, 0, time.UTC))
	// 25 October: 02:30 CEST and, after 03:00 CEST falls back to 02:00
	// CET, 02:30 CET.
	require.Equal(t, keysOf("berlin", "2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"), f.keys(t))
}

// Jitter delays each slot by the same offset in every process, within
// [0, Jitter].
func TestJitterIsDeterministic(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	sc := schedule.Schedule{Name: "jittered", Every: time.Hour, Jitter: 30 * time.Minute, Job: job}
	s := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{sc}})
	epoch := acquire(t, s)
	var enqueuedAt time.Duration
	f.clock.Set(time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC))
	for d := time.Duration(0); d <= 30*time.Minute; d += time.Second {
		f.clock.Set(time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC).Add(d))
		n, err := s.TickOnce(t.Context(), epoch)
		require.NoError(t, err)
		if n == 1 {
			enqueuedAt = d
			break
		}
	}
	require.Len(t, f.keys(t), 1)
	require.Positive(t, enqueuedAt, "a 30-minute jitter that hashes to 0 is unlikely")
	// Another scheduler computes the same offset for the same slot.
	require.Equal(t, enqueuedAt.Truncate(time.Second), schedule.JitterOffset(sc, time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC)).Truncate(time.Second)+jitterRounding(schedule.JitterOffset(sc, time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC))))
}

// jitterRounding is the second a tick every second adds to an offset with
// a fraction of a second.
func jitterRounding(d time.Duration) time.Duration {
	if d%time.Second != 0 {
		return time.Second
	}
	return 0
}

// Two schedulers competing for the lease, with the lease taken from the
// active one again and again, never enqueue two jobs for one slot, and
// enqueue every slot (catch-up covers the takeovers).
func TestCompetingSchedulers(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	cfg := schedule.Config{
		Schedules:     []schedule.Schedule{everyMinute("minutely", schedule.MisfireCatchUp, 1000)},
		LeaseDuration: 300 * time.Millisecond,
		Tick:          time.Second,
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range 2 {
		c := cfg
		c.Holder = fmt.Sprintf("scheduler-%d", i)
		s := f.scheduler(t, c)
		require.NoError(t, s.Register(t.Context())) // before the clock moves
		wg.Go(func() { require.NoError(t, s.Run(ctx)) })
	}
	const slots = 40
	for i := range slots {
		f.clock.Advance(time.Minute)
		time.Sleep(20 * time.Millisecond)
		if i%5 == 4 {
			// Take the lease from whoever holds it.
			_, err := f.db.Pool.Exec(t.Context(), fmt.Sprintf("UPDATE %s.schedule_lease SET lease_until = '-infinity'", f.db.Schema))
			require.NoError(t, err)
		}
	}
	require.Eventually(t, func() bool {
		f.clock.Advance(time.Second)
		return len(f.keys(t)) >= slots
	}, 20*time.Second, 50*time.Millisecond)
	cancel()
	wg.Wait()
	keys := f.keys(t)
	require.Len(t, keys, slots, "one job per slot")
	for i, k := range keys {
		require.Equal(t, schedule.SlotKey("minutely", time.Date(2026, 1, 5, 10, i, 0, 0, time.UTC)), k)
	}
}

// NewScheduler refuses a bad code schedule or configuration, naming the
// field, before anything is written.
func TestNewSchedulerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	for field, cfg := range map[string]schedule.Config{
		"Schedules[1].Cron":     {Schedules: []schedule.Schedule{everyMinute("a", "", 0), {Name: "b", Cron: "99 * * * *", Job: job}}},
		"Schedules[0].TimeZone": {Schedules: []schedule.Schedule{{Name: "a", Cron: "@daily", TimeZone: "Nowhere/Else", Job: job}}},
		"Schedules[0].Every":    {Schedules: []schedule.Schedule{{Name: "a", Every: time.Millisecond, Job: job}}},
		"Schedules[1].Name":     {Schedules: []schedule.Schedule{everyMinute("a", "", 0), everyMinute("a", "", 0)}},
		"LeaseDuration":         {LeaseDuration: time.Millisecond},
		"Tick":                  {Tick: -time.Second},
	} {
		cfg.Schema = f.db.Schema
		_, err := schedule.NewScheduler(f.db.Pool, f.jobs, cfg)
		var verr *llmqtype.ValidationError
		require.ErrorAs(t, err, &verr, field)
		require.Equal(t, field, verr.Field)
		require.ErrorIs(t, err, schedule.ErrInvalid)
	}
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), fmt.Sprintf("SELECT count(*) FROM %s.schedules", f.db.Schema)).Scan(&n))
	require.Zero(t, n)
}

// llmq.schedule.lag records, per schedule, the time from each slot to its
// job's enqueue.
func TestLagMetric(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	reader := sdkmetric.NewManualReader()
	s := f.scheduler(t, schedule.Config{
		Schedules:     []schedule.Schedule{everyMinute("minutely", schedule.MisfireCatchUp, 2)},
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	epoch := acquire(t, s)
	f.clock.Set(time.Date(2026, 1, 5, 10, 1, 5, 0, time.UTC)) // 10:00 65s late, 10:01 5s late
	n, err := s.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	var found bool
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "llmq.schedule.lag" {
				continue
			}
			found = true
			require.Equal(t, "s", m.Unit)
			h, ok := m.Data.(metricdata.Histogram[float64])
			require.True(t, ok, "llmq.schedule.lag is a histogram")
			require.Len(t, h.DataPoints, 1)
			dp := h.DataPoints[0]
			require.Equal(t, uint64(2), dp.Count)
			require.InDelta(t, 70, dp.Sum, 0.001)
			v, ok := dp.Attributes.Value(attribute.Key("schedule"))
			require.True(t, ok)
			require.Equal(t, "minutely", v.AsString())
		}
	}
	require.True(t, found)
}

// A scheduler without code schedules enqueues the operator's; a code
// schedule only another build registers waits for a scheduler of that
// build.
func TestCodeScheduleOfAnotherBuildWaits(t *testing.T) {
	t.Parallel()
	f := setup(t, t0)
	newer := f.scheduler(t, schedule.Config{Schedules: []schedule.Schedule{everyMinute("newer", "", 0)}})
	require.NoError(t, newer.Register(t.Context()))
	older := f.scheduler(t, schedule.Config{})
	require.NoError(t, older.Store().Put(t.Context(), f.db.Pool, everyMinute("ops", "", 0)))
	epoch := acquire(t, older)
	f.clock.Advance(time.Minute)
	n, err := older.TickOnce(t.Context(), epoch)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, keysOf("ops", "2026-01-05T10:00:00Z"), f.keys(t))
}
