package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/schedule"
)

// runSchedules dispatches the schedule commands: list them with their
// next and last runs, pause one, resume one.
func runSchedules(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand("schedules", args, "list", "pause", "resume")
	if err != nil {
		return err
	}
	if sub == "list" {
		return runSchedulesList(ctx, args, stdout, stderr)
	}
	return runSchedulesChange(ctx, sub, args, stdout, stderr)
}

// openSchedules opens the schedule store of the chosen schema.
func openSchedules(ctx context.Context, c *common) (*schedule.Store, *session, error) {
	store, err := schedule.NewStore(schedule.StoreConfig{Schema: c.schema})
	if err != nil {
		return nil, nil, err
	}
	s, err := c.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	return store, s, nil
}

func runSchedulesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("schedules list", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	store, s, err := openSchedules(ctx, c)
	if err != nil {
		return err
	}
	defer s.close()
	list, err := store.List(ctx, s.pool)
	if err != nil {
		return err
	}
	if c.json {
		out := make([]scheduleJSON, len(list))
		for i, st := range list {
			out[i] = toScheduleJSON(st)
		}
		return writeJSON(stdout, out)
	}
	return printSchedules(stdout, list)
}

// runSchedulesChange pauses or resumes the schedule its one argument names
// and prints it as it now stands.
func runSchedulesChange(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	name := "schedules " + sub
	fs, c := newFlagSet(name, stderr)
	pos, err := parseArgs(fs, args, 1, name+" needs a schedule's name: "+name+" NAME")
	if err != nil {
		return err
	}
	store, s, err := openSchedules(ctx, c)
	if err != nil {
		return err
	}
	defer s.close()
	change := store.Pause
	if sub == "resume" {
		change = store.Resume
	}
	if err := change(ctx, s.pool, pos[0]); err != nil {
		if errors.Is(err, schedule.ErrNotFound) {
			return fmt.Errorf("%w: %s: no schedule is named %q (llmq schedules list shows them)", errInvalidInput, name, pos[0])
		}
		return err
	}
	now, err := store.Get(ctx, s.pool, pos[0])
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(stdout, toScheduleJSON(now))
	}
	return printSchedules(stdout, []schedule.Status{now})
}

// scheduleJSON is a schedule as --json prints it.
type scheduleJSON struct {
	Name           string    `json:"name"`
	Cron           string    `json:"cron,omitempty"`
	EverySeconds   float64   `json:"every_seconds,omitempty"`
	TimeZone       string    `json:"time_zone"`
	JitterSeconds  float64   `json:"jitter_seconds,omitempty"`
	Misfire        string    `json:"misfire"`
	CatchUpMax     int       `json:"catch_up_max,omitempty"`
	Kind           string    `json:"kind"`
	Queue          string    `json:"queue,omitempty"`
	Tenant         string    `json:"tenant"`
	Source         string    `json:"source"`
	Paused         bool      `json:"paused"`
	NextSlot       time.Time `json:"next_slot,omitzero"`
	LastSlot       time.Time `json:"last_slot,omitzero"`
	LastJob        uuid.UUID `json:"last_job,omitzero"`
	LastEnqueuedAt time.Time `json:"last_enqueued_at,omitzero"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func toScheduleJSON(st schedule.Status) scheduleJSON {
	return scheduleJSON{
		Name: st.Name, Cron: st.Cron, EverySeconds: st.Every.Seconds(), TimeZone: zoneOf(st.TimeZone),
		JitterSeconds: st.Jitter.Seconds(), Misfire: string(st.Misfire), CatchUpMax: st.CatchUpMax,
		Kind: st.Job.Kind, Queue: st.Job.Queue, Tenant: st.Job.Tenant, Source: string(st.Source), Paused: st.Paused,
		NextSlot: st.NextSlot, LastSlot: st.LastSlot, LastJob: st.LastJob, LastEnqueuedAt: st.LastEnqueuedAt,
		CreatedAt: st.CreatedAt, UpdatedAt: st.UpdatedAt,
	}
}

func printSchedules(w io.Writer, list []schedule.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tWHEN\tZONE\tKIND\tQUEUE\tSOURCE\tSTATE\tNEXT SLOT\tLAST SLOT\tLAST JOB")
	for _, st := range list {
		state := "active"
		if st.Paused {
			state = "paused"
		}
		when := st.Cron
		if st.Every > 0 {
			when = "every " + st.Every.String()
		}
		lastJob := "-"
		if st.LastJob != uuid.Nil {
			lastJob = st.LastJob.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", st.Name, when, zoneOf(st.TimeZone), st.Job.Kind,
			orDash(st.Job.Queue), st.Source, state, slot(st.NextSlot), slot(st.LastSlot), lastJob)
	}
	if len(list) == 0 {
		fmt.Fprintln(tw, "(no schedules)")
	}
	return tw.Flush()
}

func zoneOf(tz string) string {
	if tz == "" {
		return "UTC"
	}
	return tz
}

// slot prints a slot's time in UTC, or "-" for none.
func slot(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
