package jobs

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/internal/telemetry"
)

// DefaultGaugeRefresh is how long the queue gauges reuse one reading.
const DefaultGaugeRefresh = 15 * time.Second

// QueueDepth is one queue's unfinished jobs.
type QueueDepth struct {
	Queue string `json:"queue"`
	// Runnable jobs are READY or RETRY_SCHEDULED and due: the backlog a
	// runner could claim now (tenant caps and group order aside).
	Runnable int64 `json:"runnable"`
	// Scheduled jobs wait for a later AvailableAt: retries and delayed jobs.
	Scheduled int64 `json:"scheduled"`
	// Running jobs are leased by a worker.
	Running int64 `json:"running"`
	// OldestRunnableAge is how long the longest-waiting runnable job has
	// been due; zero when none is.
	OldestRunnableAge time.Duration `json:"oldest_runnable_age"`
}

// Depth reads every queue's unfinished jobs through the claim and running
// indexes, never the finished history (see QueueDepth in queries.sql). Its
// cost grows with the number of unfinished jobs: an index-only scan of one
// entry per job. Stats also counts the jobs finished within StatsWindow,
// through jobs_finished_idx, so its cost follows the recent rate too.
// Queues of the store's Config with no unfinished job are reported with
// zeros.
func (s *PostgresStore) Depth(ctx context.Context, db DBTX) ([]QueueDepth, error) {
	rows, err := db.Query(ctx, s.sql.queueDepth)
	if err != nil {
		return nil, fmt.Errorf("jobs: queue depth: %w", err)
	}
	index := make(map[string]int, len(s.cfg.Queues)) // queue -> position in out
	out := make([]QueueDepth, 0, len(s.cfg.Queues))
	for _, q := range s.cfg.Queues {
		index[q] = len(out)
		out = append(out, QueueDepth{Queue: q})
	}
	read, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueDepth, error) {
		var r depthRow
		err := row.Scan(r.dest()...)
		return r.depth(), err
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: queue depth: %w", err)
	}
	for _, r := range read {
		i, ok := index[r.Queue]
		if !ok {
			i = len(out)
			index[r.Queue] = i
			out = append(out, QueueDepth{Queue: r.Queue})
		}
		d := &out[i]
		d.Runnable += r.Runnable
		d.Scheduled += r.Scheduled
		d.Running += r.Running
		d.OldestRunnableAge = max(d.OldestRunnableAge, r.OldestRunnableAge)
	}
	return out, nil
}

// GaugeConfig configures the queue gauges (RegisterGauges).
type GaugeConfig struct {
	// MeterProvider receives the gauges. Nil registers nothing.
	MeterProvider metric.MeterProvider
	// Refresh is the longest one reading of the database is reused: a
	// scrape reads at most once per Refresh, whatever the scrape rate.
	// Default 15s.
	Refresh time.Duration
}

// RegisterGauges registers the observable gauges of the store's queues on
// cfg.MeterProvider, read through db with Depth at most once per
// cfg.Refresh:
//
//   - llmq.jobs ({job}; queue, state = runnable | scheduled | running):
//     unfinished jobs.
//   - llmq.jobs.oldest_runnable_age (s; queue): how long the
//     longest-waiting runnable job has been due.
//
// Call Unregister on the result to stop; lease.Runner registers them for
// the time it runs when its Config has a MeterProvider.
func (s *PostgresStore) RegisterGauges(db DBTX, cfg GaugeConfig) (metric.Registration, error) {
	if cfg.Refresh < 0 {
		return nil, fmt.Errorf("jobs: GaugeConfig.Refresh is %s; use 0 for the default or a positive duration", cfg.Refresh)
	}
	meter := telemetry.Meter(cfg.MeterProvider, "jobs")
	count, err := meter.Int64ObservableGauge("llmq.jobs", metric.WithUnit("{job}"),
		metric.WithDescription("Unfinished jobs by queue and state: runnable (due now), scheduled (due later), running."))
	if err != nil {
		return nil, fmt.Errorf("jobs: gauge: %w", err)
	}
	age, err := meter.Float64ObservableGauge("llmq.jobs.oldest_runnable_age", metric.WithUnit("s"),
		metric.WithDescription("How long the longest-waiting runnable job of the queue has been due."))
	if err != nil {
		return nil, fmt.Errorf("jobs: gauge: %w", err)
	}
	snap := telemetry.NewSnapshot(cmp.Or(cfg.Refresh, DefaultGaugeRefresh), func(ctx context.Context) ([]QueueDepth, error) {
		return s.Depth(ctx, db)
	})
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		depths, err := snap.Get(ctx)
		if err != nil {
			return err
		}
		for _, d := range depths {
			q := attribute.String("queue", d.Queue)
			o.ObserveInt64(count, d.Runnable, metric.WithAttributes(q, attribute.String("state", "runnable")))
			o.ObserveInt64(count, d.Scheduled, metric.WithAttributes(q, attribute.String("state", "scheduled")))
			o.ObserveInt64(count, d.Running, metric.WithAttributes(q, attribute.String("state", "running")))
			o.ObserveFloat64(age, d.OldestRunnableAge.Seconds(), metric.WithAttributes(q))
		}
		return nil
	}, count, age)
}
