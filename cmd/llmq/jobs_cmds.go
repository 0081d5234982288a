package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/jobs"
)

// runJobsList prints a page of jobs, newest first, across tenants unless
// -tenant narrows it, filtered by state and kind; the last line gives the
// command for the next page.
func runJobsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("jobs list", stderr)
	tenant := fs.String("tenant", "", "only this tenant's jobs")
	states := fs.String("state", "", "only jobs in these states, comma-separated (READY, RUNNING, RETRY_SCHEDULED, SUCCEEDED, REVIEW_REQUIRED, FAILED_TERMINAL, CANCELLED)")
	kind := fs.String("kind", "", "only jobs of this kind")
	cursor := fs.String("cursor", "", "continue after the page that printed this cursor")
	limit := fs.Int("limit", 50, fmt.Sprintf("jobs per page, 1 to %d", jobs.MaxListLimit))
	if err := parse(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > jobs.MaxListLimit {
		return fmt.Errorf("%w: jobs list: -limit is %d; use 1 to %d", errUsage, *limit, jobs.MaxListLimit)
	}
	filter, err := parseStates(*states)
	if err != nil {
		return err
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	page, err := s.jobs.ListAll(ctx, s.pool, jobs.ListAllParams{Tenant: *tenant, States: filter, Kind: *kind, Cursor: *cursor, Limit: *limit})
	if err != nil {
		return err
	}
	if c.json {
		if page.Jobs == nil {
			page.Jobs = []*jobs.Job{}
		}
		return writeJSON(stdout, map[string]any{"jobs": page.Jobs, "next_cursor": page.NextCursor})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tTENANT\tKIND\tQUEUE\tSTATE\tATTEMPTS\tCREATED\tCLASS\tERROR")
	for _, j := range page.Jobs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", j.ID, j.Tenant, j.Kind, j.Queue, j.State,
			j.Attempt, j.MaxAttempts, j.CreatedAt.UTC().Format(time.RFC3339), j.ErrorClass, firstLine(j.LastError))
	}
	if len(page.Jobs) == 0 {
		fmt.Fprintln(tw, "(no jobs)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.NextCursor != "" {
		fmt.Fprintf(stdout, "next page: -cursor %s\n", page.NextCursor)
	}
	return nil
}

// parseStates reads -state: comma-separated state names, in any case.
func parseStates(list string) ([]jobs.State, error) {
	if list == "" {
		return nil, nil
	}
	var states []jobs.State
	for name := range strings.SplitSeq(list, ",") {
		st := jobs.State(strings.ToUpper(strings.TrimSpace(name)))
		if !st.Valid() {
			return nil, fmt.Errorf("%w: jobs list: -state %q is not a state; use %s", errInvalidInput, name, stateNames())
		}
		states = append(states, st)
	}
	return states, nil
}

func stateNames() string {
	names := make([]string, 0, len(jobs.States()))
	for _, st := range jobs.States() {
		names = append(names, string(st))
	}
	return strings.Join(names, ", ")
}

// runJobsCancel cancels a waiting job, or asks the runner of a running one
// to cancel it, and prints the job's state after.
func runJobsCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, s, job, err := openJobArg(ctx, "jobs cancel", args, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	id := job.ID
	job, err = s.jobs.Cancel(ctx, s.pool, job.Tenant, id)
	if err != nil && !errors.Is(err, jobs.ErrAlreadyFinished) {
		return err
	}
	if c.json {
		if jsonErr := writeJSON(stdout, job); jsonErr != nil {
			return jsonErr
		}
		return err
	}
	switch {
	case err != nil:
		return fmt.Errorf("job %s is %s: it finished before it could be cancelled: %w", id, job.State, err)
	case job.State == jobs.StateRunning:
		fmt.Fprintf(stdout, "job %s: RUNNING, cancellation requested: its runner cancels the attempt's context and records it CANCELLED\n", id)
	default:
		fmt.Fprintf(stdout, "job %s: %s\n", id, job.State)
	}
	return nil
}
