package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/retention"
)

// statsReport is what stats prints: the queues by state, the outbox's
// publication lag, each tenant's unfinished work with its limits, each
// kind's unfinished work (a kind no runner serves shows as runnable work
// that only ages), and what each route candidate did lately.
type statsReport struct {
	Queues  []queueJSON   `json:"queues"`
	Outbox  outboxJSON    `json:"outbox"`
	Tenants []backlogJSON `json:"tenants"`
	Kinds   []kindJSON    `json:"kinds"`
	// Routes: per route candidate and model, the attempts started in the
	// last RoutesWindowSeconds (-routes-window, default 1h) that ended on
	// it, by outcome, and its calls that moved on, by failure (see
	// stats_routes.go). Empty without routed kinds.
	Routes              []jobs.CandidateStats `json:"routes"`
	RoutesWindowSeconds float64               `json:"routes_window_seconds"`
	// Retention: the policy in force, the last pass, the oldest row per
	// table, and whether a relay ever ran (see stats_retention.go).
	Retention retention.Status `json:"retention"`
}

type kindJSON struct {
	Queue                    string  `json:"queue"`
	Kind                     string  `json:"kind"`
	Runnable                 int64   `json:"runnable"`
	Scheduled                int64   `json:"scheduled"`
	InFlight                 int64   `json:"in_flight"`
	OldestRunnableAgeSeconds float64 `json:"oldest_runnable_age_seconds"`
}

type queueJSON struct {
	Queue                    string               `json:"queue"`
	Counts                   map[jobs.State]int64 `json:"counts"`
	OldestEligibleAgeSeconds float64              `json:"oldest_eligible_age_seconds"`
}

type outboxJSON struct {
	// Unpublished is the backlog of events not yet confirmed by a broker,
	// and OldestUnpublishedAgeSeconds the age of its oldest: the lag.
	Unpublished                 int64   `json:"unpublished"`
	OldestUnpublishedAgeSeconds float64 `json:"oldest_unpublished_age_seconds"`
	// AtLeast: the backlog was counted no further than Unpublished (a
	// bounded count, so stats stays fast on a host whose events nobody
	// publishes).
	AtLeast bool `json:"at_least,omitempty"`
}

// outboxCountLimit bounds stats' count of the unpublished backlog.
const outboxCountLimit = 1_000

type backlogJSON struct {
	Queue                    string  `json:"queue"`
	Tenant                   string  `json:"tenant"`
	Runnable                 int64   `json:"runnable"`
	Scheduled                int64   `json:"scheduled"`
	InFlight                 int64   `json:"in_flight"`
	OldestRunnableAgeSeconds float64 `json:"oldest_runnable_age_seconds"`
	Weight                   int     `json:"weight"`
	MaxInFlight              int     `json:"max_in_flight"` // 0: no cap
	OwnLimits                bool    `json:"own_limits"`    // false: the defaults apply
}

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("stats", stderr)
	routesWindow := fs.Duration("routes-window", defaultRoutesWindow, "how far back the routes table counts attempts (by their start)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *routesWindow <= 0 {
		return fmt.Errorf("%w: stats: -routes-window must be positive", errUsage)
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	report, err := s.stats(ctx, c.schema)
	if err != nil {
		return err
	}
	if report.Retention, err = s.readRetention(ctx, c.schema); err != nil {
		return err
	}
	report.RoutesWindowSeconds = routesWindow.Seconds()
	if report.Routes, err = s.readRoutes(ctx, *routesWindow); err != nil {
		return err
	}
	if c.json {
		return writeJSON(stdout, report)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "QUEUE\t")
	for _, st := range jobs.States() {
		fmt.Fprintf(tw, "%s\t", st)
	}
	fmt.Fprint(tw, "OLDEST ELIGIBLE\t\n")
	for _, q := range report.Queues {
		fmt.Fprintf(tw, "%s\t", q.Queue)
		for _, st := range jobs.States() {
			fmt.Fprintf(tw, "%d\t", q.Counts[st])
		}
		fmt.Fprintf(tw, "%s\t\n", age(q.OldestEligibleAgeSeconds))
	}
	if len(report.Queues) == 0 {
		fmt.Fprint(tw, "(no jobs)\t\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "(waiting and running jobs: all; finished states: jobs finished in the last %s; the history per state is under retention below)\n", jobs.StatsWindow)

	printOutbox(stdout, report)

	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "QUEUE\tTENANT\tRUNNABLE\tSCHEDULED\tIN FLIGHT\tOLDEST RUNNABLE\tWEIGHT\tMAX IN FLIGHT\n")
	for _, b := range report.Tenants {
		suffix := ""
		if !b.OwnLimits {
			suffix = " (default)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d%s\t%s%s\n", b.Queue, b.Tenant, b.Runnable, b.Scheduled, b.InFlight,
			age(b.OldestRunnableAgeSeconds), b.Weight, suffix, limit(int64(b.MaxInFlight)), suffix)
	}
	if len(report.Tenants) == 0 {
		fmt.Fprintln(tw, "(no unfinished jobs)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "QUEUE\tKIND\tRUNNABLE\tSCHEDULED\tIN FLIGHT\tOLDEST RUNNABLE\n")
	for _, k := range report.Kinds {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", k.Queue, k.Kind, k.Runnable, k.Scheduled, k.InFlight, age(k.OldestRunnableAgeSeconds))
	}
	if len(report.Kinds) == 0 {
		fmt.Fprintln(tw, "(no unfinished jobs)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printRoutes(stdout, report); err != nil {
		return err
	}
	return printRetention(stdout, report.Retention)
}

func (s *session) stats(ctx context.Context, schema string) (statsReport, error) {
	var r statsReport
	queues, err := s.jobs.Stats(ctx, s.pool)
	if err != nil {
		return r, err
	}
	r.Queues = make([]queueJSON, 0, len(queues))
	for _, q := range queues {
		r.Queues = append(r.Queues, queueJSON{q.Queue, q.Counts, q.OldestEligibleAge.Seconds()})
	}
	pruner, err := outbox.NewPruner(schema)
	if err != nil {
		return r, err
	}
	n, capped, oldest, err := pruner.Backlog(ctx, s.pool, outboxCountLimit)
	if err != nil {
		return r, err
	}
	r.Outbox = outboxJSON{Unpublished: n, OldestUnpublishedAgeSeconds: oldest.Seconds(), AtLeast: capped}
	backlogs, err := s.jobs.TenantBacklogs(ctx, s.pool)
	if err != nil {
		return r, err
	}
	r.Tenants = make([]backlogJSON, 0, len(backlogs))
	for _, b := range backlogs {
		r.Tenants = append(r.Tenants, backlogJSON{
			Queue: b.Queue, Tenant: b.Tenant, Runnable: b.Runnable, Scheduled: b.Scheduled, InFlight: b.Running,
			OldestRunnableAgeSeconds: b.OldestRunnableAge.Seconds(),
			Weight:                   b.Limits.Weight, MaxInFlight: b.Limits.MaxRunning, OwnLimits: b.OwnLimits,
		})
	}
	kinds, err := s.jobs.KindBacklogs(ctx, s.pool)
	if err != nil {
		return r, err
	}
	r.Kinds = make([]kindJSON, 0, len(kinds))
	for _, k := range kinds {
		r.Kinds = append(r.Kinds, kindJSON{Queue: k.Queue, Kind: k.Kind, Runnable: k.Runnable, Scheduled: k.Scheduled,
			InFlight: k.Running, OldestRunnableAgeSeconds: k.OldestRunnableAge.Seconds()})
	}
	return r, nil
}

// age prints seconds as a duration rounded for people.
func age(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d == 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// limit prints a limit whose zero means none.
func limit(v int64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatInt(v, 10)
}
