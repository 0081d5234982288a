// Package schedule is llmq's periodic jobs: a schedule (a cron expression
// in a time zone, or a fixed interval) enqueues one job per slot through
// the job store. Every process runs a Scheduler, and the one holding the
// schedulers' lease enqueues, so a fleet enqueues each slot once.
//
// Guarantees:
//   - One job per slot across the fleet. A slot's job is enqueued with the
//     idempotency key "schedule:<name>:<slot in UTC, RFC 3339>" (SlotKey),
//     in one transaction with the schedule's progress (next_slot), and
//     that transaction is fenced by the lease: it holds the lease row FOR
//     SHARE with the epoch its scheduler acquired, so a scheduler that lost
//     the lease (paused past it, cut off from the database) writes nothing,
//     and a takeover waits for a tick in flight and then sees its progress.
//     A tick replayed, or redone by the next leader, finds the slot's job
//     under its key and enqueues no second one.
//   - Exactly one Scheduler is active: it holds the fenced lease (table
//     schedule_lease, as the outbox relay's), renews it every third of
//     Config.LeaseDuration, and releases it when Run returns. A standby
//     checks every half LeaseDuration and takes the lease over once it
//     expired, so a dead scheduler's slots are enqueued within about
//     1.5 × LeaseDuration plus a Tick.
//   - Missed slots (the scheduler was down for longer than a period):
//     MisfireSkip, the default, enqueues only the latest due slot, however
//     late, and skips the earlier ones, as River's periodic jobs and
//     Oban's cron do not make up missed runs either (unlike Oban, the
//     current period's slot is still enqueued late). MisfireCatchUp
//     enqueues the latest CatchUpMax due slots (default 10), oldest first.
//     Pause stops a schedule; Resume carries on from the first slot after
//     now and never enqueues the slots that came while it was paused.
//   - Slots: an Every schedule's slots are the multiples of Every since the
//     Unix epoch; a Cron schedule's are robfig/cron/v3's, read in TimeZone
//     (default UTC; five fields, or @hourly, @daily, @weekly, @monthly,
//     @yearly). Jitter delays each slot by a hash of the name and the slot
//     in [0, Jitter], the same in every process.
//   - Daylight saving time follows robfig/cron: a slot at a wall-clock time
//     a change skips is not enqueued that day, and one at a time a change
//     repeats is enqueued twice. In Europe/Berlin a daily "30 2 * * *" has
//     no slot on the spring-forward day (02:00 CET jumps to 03:00 CEST) and
//     two on the fall-back day, 02:30 CEST and 02:30 CET, an hour apart
//     (each its own UTC slot and job). Schedule such jobs outside 02:00 to
//     03:00, or in UTC, to run them exactly once a day.
//   - A bad schedule (cron, zone, interval, jitter, misfire, job) is
//     refused with a *llmqtype.ValidationError naming the field
//     (errors.Is ErrInvalid) before anything is written. A job the job
//     store refuses when a slot comes (a queue it does not have) skips that
//     slot, logged as an error, rather than retrying it forever.
//   - The lag from a slot to its job's enqueue is the histogram
//     llmq.schedule.lag (seconds, attribute schedule).
//
// # Code and operator schedules
//
// Schedules in Config.Schedules are registered in code: every Run upserts
// them at start, replacing their spec and keeping whether they are paused
// and their progress (a changed Cron, Every or TimeZone restarts them from
// the first slot after now). A scheduler enqueues the code schedules it
// registers and every operator schedule; a code schedule only a newer
// build registers waits, during a rolling deploy, for a scheduler of that
// build to lead. A code schedule removed from the code stays stored, and
// is no longer enqueued, until Store.Delete removes it. Operators add
// schedules with Store.Put and remove them with Store.Delete; Store.List
// shows each with its next and last slots and last job.
//
// # Usage
//
//	nightly := schedule.Schedule{
//		Name:     "invoice.reconcile",
//		Cron:     "0 3 * * *",
//		TimeZone: "Europe/Berlin",
//		Job:      jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.reconcile"},
//		Jitter:   5 * time.Minute,
//	}
//	s, err := schedule.NewScheduler(pool, jobStore, schedule.Config{
//		Schema:    "llmq",
//		Schedules: []schedule.Schedule{nightly},
//	})
//	if err != nil {
//		return err
//	}
//	go s.Run(ctx) // in every process; one enqueues
//
// With a typed kind, ForKind builds Job from the kind's arguments.
package schedule
