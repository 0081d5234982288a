package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/schedule"
)

// exampleClock starts a second before 03:00 in Berlin and lets the
// scheduler's ticks move it up to 03:00:01, then stops, so the example
// sees one slot without waiting for one.
type exampleClock struct {
	mu   sync.Mutex
	now  time.Time
	stop time.Time
}

func (c *exampleClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *exampleClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if c.now.Before(c.stop) {
		c.now = c.now.Add(d)
		ch <- c.now
	}
	return ch
}

// A schedule registered in code: every process runs a Scheduler with it,
// the one holding the lease enqueues the 03:00 job, once.
func ExampleScheduler() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_schedule") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_schedule"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_schedule"})
	if err != nil {
		panic(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}

	nightly := schedule.Schedule{
		Name:     "invoice.reconcile",
		Cron:     "0 3 * * *",
		TimeZone: "Europe/Berlin",
		Job:      jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.reconcile", Payload: []byte(`{"scope":"yesterday"}`)},
	}
	s, err := schedule.NewScheduler(pool, store, schedule.Config{
		Schema:    "llmq_example_schedule",
		Schedules: []schedule.Schedule{nightly},
		// Real time by default; here a clock a second before the slot.
		Clock:  &exampleClock{now: time.Date(2026, 6, 1, 2, 59, 59, 0, berlin), stop: time.Date(2026, 6, 1, 3, 0, 1, 0, berlin)},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()

	var page *jobs.ListResult
	for page == nil || len(page.Jobs) == 0 {
		time.Sleep(10 * time.Millisecond)
		if page, err = store.List(ctx, pool, jobs.ListParams{Tenant: "acme"}); err != nil {
			panic(err)
		}
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	j := page.Jobs[0]
	fmt.Println(j.Kind, j.IdempotencyKey, string(j.Payload))

	list, err := s.Store().List(ctx, pool)
	if err != nil {
		panic(err)
	}
	for _, st := range list {
		fmt.Println(st.Name, st.Source, "last:", st.LastSlot.In(berlin).Format(time.DateTime), "next:", st.NextSlot.In(berlin).Format(time.DateTime))
	}
	// Output:
	// invoice.reconcile schedule:invoice.reconcile:2026-06-01T01:00:00Z {"scope": "yesterday"}
	// invoice.reconcile code last: 2026-06-01 03:00:00 next: 2026-06-02 03:00:00
}
