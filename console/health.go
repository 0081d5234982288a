package console

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Thresholds are where the overview's Health figures turn from ok to
// warning (amber) and critical (red). A figure is at a level when it is at
// or above that level's threshold. Every zero field means its default (the
// Default* constants; doc.go gives the reasoning); negative values, an
// amber above its red, and rates above 1 are refused by New.
type Thresholds struct {
	// OldestRunnableAmber and OldestRunnableRed grade the age of a
	// queue's oldest runnable job (due, not claimed). Default 5m and 30m,
	// the LlmqQueueBacklogOld alert's warning and critical.
	OldestRunnableAmber, OldestRunnableRed time.Duration
	// FailureRateAmber and FailureRateRed grade a queue's failed attempts
	// (failed and retry_scheduled) over the attempts that ran (all but
	// released and snoozed) in the last hour, fractions in (0, 1]. Default
	// 0.10 and 0.25 (LlmqFailureRateHigh fires above 0.25).
	FailureRateAmber, FailureRateRed float64
	// FailureMinFailures is how many failed attempts a queue needs in the
	// hour before its rate is graded at all: a quiet queue's few failures
	// stay ok, as the alert asks for one a minute. Default 10.
	FailureMinFailures int
	// DeadLettersAmber and DeadLettersRed grade the jobs that became dead
	// letters (FAILED_TERMINAL) in the last hour. Default 1 and 10
	// (LlmqDeadLettersGrowing fires above 10 in an hour).
	DeadLettersAmber, DeadLettersRed int
	// ReviewAmber and ReviewRed grade the review backlog (REVIEW_REQUIRED
	// jobs). Default 1 and 100.
	ReviewAmber, ReviewRed int
	// OutboxLagAmber and OutboxLagRed grade the age of the oldest
	// unpublished outbox event. Default 2m (LlmqOutboxLagHigh) and 10m
	// (LlmqOutboxNotPublishing's ten minutes). Events waiting while no
	// relay holds the leader lease are critical whatever their age.
	OutboxLagAmber, OutboxLagRed time.Duration
	// RetentionAmber grades the retention service: warning when its last
	// pass is older than this, or when it never ran and nobody holds its
	// lease. Default 15m (the service passes every minute by default; its
	// lease is 3 minutes). Retention has no critical level.
	RetentionAmber time.Duration
}

// The Thresholds' defaults.
const (
	DefaultOldestRunnableAmber = 5 * time.Minute
	DefaultOldestRunnableRed   = 30 * time.Minute
	DefaultFailureRateAmber    = 0.10
	DefaultFailureRateRed      = 0.25
	DefaultFailureMinFailures  = 10
	DefaultDeadLettersAmber    = 1
	DefaultDeadLettersRed      = 10
	DefaultReviewAmber         = 1
	DefaultReviewRed           = 100
	DefaultOutboxLagAmber      = 2 * time.Minute
	DefaultOutboxLagRed        = 10 * time.Minute
	DefaultRetentionAmber      = 15 * time.Minute
)

// withDefaults validates t and fills its zero fields.
func (t Thresholds) withDefaults() (Thresholds, error) {
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"OldestRunnableAmber", t.OldestRunnableAmber < 0}, {"OldestRunnableRed", t.OldestRunnableRed < 0},
		{"FailureRateAmber", t.FailureRateAmber < 0}, {"FailureRateRed", t.FailureRateRed < 0},
		{"FailureMinFailures", t.FailureMinFailures < 0},
		{"DeadLettersAmber", t.DeadLettersAmber < 0}, {"DeadLettersRed", t.DeadLettersRed < 0},
		{"ReviewAmber", t.ReviewAmber < 0}, {"ReviewRed", t.ReviewRed < 0},
		{"OutboxLagAmber", t.OutboxLagAmber < 0}, {"OutboxLagRed", t.OutboxLagRed < 0},
		{"RetentionAmber", t.RetentionAmber < 0},
	} {
		if f.neg {
			return t, invalidConfig("Health."+f.name, "must not be negative")
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"FailureRateAmber", t.FailureRateAmber}, {"FailureRateRed", t.FailureRateRed}} {
		if f.v > 1 || f.v != f.v {
			return t, invalidConfig("Health."+f.name, "is a fraction of the attempts: at most 1 (0.25 is 25%)")
		}
	}
	t.OldestRunnableAmber = cmp.Or(t.OldestRunnableAmber, DefaultOldestRunnableAmber)
	t.OldestRunnableRed = cmp.Or(t.OldestRunnableRed, DefaultOldestRunnableRed)
	t.FailureRateAmber = cmp.Or(t.FailureRateAmber, DefaultFailureRateAmber)
	t.FailureRateRed = cmp.Or(t.FailureRateRed, DefaultFailureRateRed)
	t.FailureMinFailures = cmp.Or(t.FailureMinFailures, DefaultFailureMinFailures)
	t.DeadLettersAmber = cmp.Or(t.DeadLettersAmber, DefaultDeadLettersAmber)
	t.DeadLettersRed = cmp.Or(t.DeadLettersRed, DefaultDeadLettersRed)
	t.ReviewAmber = cmp.Or(t.ReviewAmber, DefaultReviewAmber)
	t.ReviewRed = cmp.Or(t.ReviewRed, DefaultReviewRed)
	t.OutboxLagAmber = cmp.Or(t.OutboxLagAmber, DefaultOutboxLagAmber)
	t.OutboxLagRed = cmp.Or(t.OutboxLagRed, DefaultOutboxLagRed)
	t.RetentionAmber = cmp.Or(t.RetentionAmber, DefaultRetentionAmber)
	for _, p := range []struct {
		name       string
		amberAbove bool
	}{
		{"OldestRunnableAmber", t.OldestRunnableAmber > t.OldestRunnableRed},
		{"FailureRateAmber", t.FailureRateAmber > t.FailureRateRed},
		{"DeadLettersAmber", t.DeadLettersAmber > t.DeadLettersRed},
		{"ReviewAmber", t.ReviewAmber > t.ReviewRed},
		{"OutboxLagAmber", t.OutboxLagAmber > t.OutboxLagRed},
	} {
		if p.amberAbove {
			return t, invalidConfig("Health."+p.name, "must not be above its red threshold (with defaults filled in)")
		}
	}
	return t, nil
}

// level is a Health figure's state; it prints as the label the page shows
// beside the colour.
type level int

const (
	levelOK level = iota
	levelWarning
	levelCritical
)

func (l level) String() string {
	switch l {
	case levelWarning:
		return "warning"
	case levelCritical:
		return "critical"
	}
	return "ok"
}

// grade places v against amber and red (at or above is at that level).
func grade[T int64 | float64 | time.Duration](v, amber, red T) level {
	switch {
	case v >= red:
		return levelCritical
	case v >= amber:
		return levelWarning
	}
	return levelOK
}

// healthData is the overview's Health section.
type healthData struct {
	State       level // the worst of the figures
	Queues      []queueHealth
	DeadLetters count // FAILED_TERMINAL jobs
	DeadHour    count // of those, finished in the last hour (the chart's)
	DeadState   level
	Review      count
	ReviewState level
	// Outbox and Retention are nil on a tenant's console.
	Outbox    *outboxHealth
	Retention *retentionHealth
	T         Thresholds
	// AttemptsSampled: the failure rates were computed from the latest
	// healthAttemptScan attempts of recent jobs only.
	AttemptsSampled bool
	ScanN           int64
}

type queueHealth struct {
	Queue    string
	Runnable count
	Age      time.Duration // of the oldest runnable job; 0 for none
	AgeBound bool          // the age is a lower bound (the walk stopped)
	AgeState level
	Failures int64 // failed and retried attempts in the last hour
	Ran      int64 // attempts that ran a handler in the last hour
	Percent  float64
	// RateState is ok below FailureMinFailures failures.
	RateState level
}

type outboxHealth struct {
	Pending   count
	Oldest    time.Duration
	Relay     string // the relay lease's holder
	RelayLive bool
	NoRelay   bool // events wait and no relay holds a live lease
	State     level
}

type retentionHealth struct {
	Holder   string
	Live     bool
	LastPass time.Time
	Never    bool // no pass recorded
	State    level
}

// healthAttemptScan bounds the attempts the failure rates read per
// refresh: those of the newest jobs accepted in the last two hours.
const healthAttemptScan = 5000

// failureWindow is how far back the failure rates' jobs were accepted.
const failureWindow = 2 * time.Hour

// queueFailures is a FailureRate row.
type queueFailures struct {
	Queue         string
	Failures, Ran int64
	Full          bool
}

func (h *Handler) failureRates(ctx context.Context, now time.Time) (map[string]queueFailures, bool, error) {
	since := uuidAt(now.Add(-failureWindow))
	query, args := h.sql.failureRate, []any{since, healthAttemptScan}
	if h.cfg.Tenant != "" {
		query, args = h.sql.failureRateTenant, append(args, h.cfg.Tenant)
	}
	rows, err := h.cfg.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, false, fmt.Errorf("console: failure rates: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queueFailures, error) {
		var q queueFailures
		var queue *string
		err := row.Scan(&queue, &q.Failures, &q.Ran, &q.Full)
		if queue != nil {
			q.Queue = *queue
		}
		return q, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("console: failure rates: %w", err)
	}
	out, full := map[string]queueFailures{}, false
	for _, q := range list {
		full = full || q.Full
		if q.Queue != "" {
			out[q.Queue] = q
		}
	}
	return out, full, nil
}

// health builds the Health section from what the overview read, and reads
// the failure rates and the dead-letter and review counts.
func (h *Handler) health(ctx context.Context, d *overviewData, now time.Time) error {
	t := h.cfg.Health
	hd := &healthData{T: t, ScanN: healthAttemptScan}
	d.Health = hd
	rates, sampled, err := h.failureRates(ctx, now)
	if err != nil {
		return err
	}
	hd.AttemptsSampled = sampled
	for _, q := range d.Queues {
		qh := queueHealth{Queue: q.Queue, Runnable: q.Runnable, AgeBound: q.Partial}
		if !q.OldestRunnable.IsZero() {
			qh.Age = max(now.Sub(q.OldestRunnable), 0)
			qh.AgeState = grade(qh.Age, t.OldestRunnableAmber, t.OldestRunnableRed)
		}
		if r, ok := rates[q.Queue]; ok {
			qh.Failures, qh.Ran = r.Failures, r.Ran
		}
		if qh.Ran > 0 {
			rate := float64(qh.Failures) / float64(qh.Ran)
			qh.Percent = rate * 100
			if qh.Failures >= int64(t.FailureMinFailures) {
				qh.RateState = grade(rate, t.FailureRateAmber, t.FailureRateRed)
			}
		}
		hd.State = max(hd.State, qh.AgeState, qh.RateState)
		hd.Queues = append(hd.Queues, qh)
	}
	if hd.DeadLetters, err = h.terminalCount(ctx, "FAILED_TERMINAL"); err != nil {
		return err
	}
	if hd.Review, err = h.terminalCount(ctx, "REVIEW_REQUIRED"); err != nil {
		return err
	}
	hd.DeadHour = d.Finished.Failed
	hd.DeadState = grade(hd.DeadHour.N, int64(t.DeadLettersAmber), int64(t.DeadLettersRed))
	hd.ReviewState = grade(hd.Review.N, int64(t.ReviewAmber), int64(t.ReviewRed))
	hd.State = max(hd.State, hd.DeadState, hd.ReviewState)
	if !d.System {
		return nil
	}
	o := &outboxHealth{Pending: d.Outbox.Pending, Oldest: d.Outbox.Oldest}
	r := &retentionHealth{}
	for _, s := range d.Services {
		switch s.Service {
		case "outbox relay":
			o.Relay, o.RelayLive = s.Holder, s.Live
		case "retention":
			r.Holder, r.Live, r.LastPass = s.Holder, s.Live, s.LastPass
		}
	}
	if o.Pending.N > 0 {
		o.State = grade(o.Oldest, t.OutboxLagAmber, t.OutboxLagRed)
		if !o.RelayLive {
			o.NoRelay, o.State = true, levelCritical
		}
	}
	r.Never = r.LastPass.IsZero()
	switch {
	case r.Never && !r.Live:
		r.State = levelWarning
	case !r.Never && now.Sub(r.LastPass) >= t.RetentionAmber:
		r.State = levelWarning
	}
	hd.Outbox, hd.Retention = o, r
	hd.State = max(hd.State, o.State, r.State)
	return nil
}
