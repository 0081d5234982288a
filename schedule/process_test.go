package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/schedule"
)

// The test binary re-executes itself as a scheduler process for the test
// that kills schedulers.
const (
	childEnv  = "LLMQ_SCHEDULE_TEST_CHILD"
	holderEnv = "LLMQ_SCHEDULE_TEST_HOLDER"
)

// everySecond is the schedule the child schedulers run: a slot every
// second of real time, every missed slot caught up.
var everySecond = schedule.Schedule{Name: "every-second", Every: time.Second,
	Misfire: schedule.MisfireCatchUp, CatchUpMax: schedule.MaxCatchUpMax, Job: job}

// runChildScheduler is a child process's body: a scheduler on the test's
// schema, on the real clock, until the process is killed.
func runChildScheduler() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	schema := os.Getenv("LLMQ_TEST_SCHEMA")
	store, err := jobs.NewStore(jobs.Config{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := schedule.NewScheduler(pool, store, schedule.Config{
		Schema: schema, Schedules: []schedule.Schedule{everySecond},
		LeaseDuration: 300 * time.Millisecond, Tick: 20 * time.Millisecond,
		Holder: os.Getenv(holderEnv), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Scheduler processes SIGKILLed at slot boundaries, the active one each
// time, over many slots: every slot from the first to the last is
// enqueued, exactly once.
func TestSchedulerProcessesKilledAtSlotBoundaries(t *testing.T) {
	if testing.Short() {
		t.Skip("kills scheduler processes for about 15 seconds")
	}
	t.Parallel()
	db := dbtest.Setup(t)
	children := map[string]*exec.Cmd{}
	next := 0
	start := func() {
		holder := fmt.Sprintf("child-%d", next)
		next++
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=scheduler", holderEnv+"="+holder,
			"LLMQ_TEST_SCHEMA="+db.Schema, "DATABASE_URL="+dbtest.URL())
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		children[holder] = cmd
	}
	kill := func(holder string) {
		cmd := children[holder]
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		delete(children, holder)
	}
	t.Cleanup(func() {
		for holder := range children {
			kill(holder)
		}
	})
	for range 3 {
		start()
	}
	// holderNow is the scheduler holding an unexpired lease, or "".
	holderNow := func() string {
		var holder *string
		err := db.Pool.QueryRow(t.Context(),
			fmt.Sprintf("SELECT holder FROM %s.schedule_lease WHERE lease_until > now()", db.Schema)).Scan(&holder)
		if err != nil || holder == nil {
			return ""
		}
		return *holder
	}

	const kills = 12
	killed := 0
	for killed < kills {
		// Just past a slot boundary, while the active scheduler is
		// enqueuing the slot.
		now := time.Now()
		time.Sleep(now.Truncate(time.Second).Add(time.Second + time.Duration(killed%4)*5*time.Millisecond).Sub(now))
		var holder string
		require.Eventually(t, func() bool {
			holder = holderNow()
			return children[holder] != nil
		}, 10*time.Second, 10*time.Millisecond)
		kill(holder)
		killed++
		start()
		time.Sleep(400 * time.Millisecond) // some slots on the next leader
	}
	// Let the last leader catch up, then stop them all.
	time.Sleep(2 * time.Second)
	for holder := range children {
		kill(holder)
	}

	store, err := schedule.NewStore(schedule.StoreConfig{Schema: db.Schema})
	require.NoError(t, err)
	st, err := store.Get(t.Context(), db.Pool, everySecond.Name)
	require.NoError(t, err)
	rows, err := db.Pool.Query(t.Context(),
		fmt.Sprintf("SELECT idempotency_key FROM %s.jobs ORDER BY idempotency_key", db.Schema))
	require.NoError(t, err)
	var keys []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	require.Greater(t, len(keys), kills, "slots enqueued")
	first, err := time.Parse(time.RFC3339, keys[0][len("schedule:every-second:"):])
	require.NoError(t, err)
	for i, k := range keys {
		require.Equal(t, schedule.SlotKey(everySecond.Name, first.Add(time.Duration(i)*time.Second)), k, "slot %d", i)
	}
	require.Equal(t, schedule.SlotKey(everySecond.Name, st.LastSlot), keys[len(keys)-1])
	require.Equal(t, st.LastSlot.Add(time.Second), st.NextSlot)
}
