package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
)

// runInspect prints one job with its attempt history and recent events.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("inspect", stderr)
	tenant := fs.String("tenant", "", "the job's tenant (required: every read is tenant-scoped)")
	if err := fs.Parse(args); err != nil {
		return usageOrHelp(err)
	}
	id, err := jobArg(fs, *tenant != "", "inspect -tenant T JOB_ID")
	if err != nil {
		return err
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	job, err := s.jobs.Get(ctx, s.pool, *tenant, id)
	if err != nil {
		return err
	}
	attempts, err := s.jobs.Attempts(ctx, s.pool, *tenant, id)
	if err != nil {
		return err
	}
	recs, err := s.events.ListByAggregate(ctx, s.pool, id)
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(stdout, map[string]any{"job": job, "attempts": attempts, "events": recs})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "job\t%s\ntenant\t%s\nkind / queue\t%s / %s\nstate\t%s (version %d)\nattempts\t%d of %d\n",
		job.ID, job.Tenant, job.Kind, job.Queue, job.State, job.StateVersion, job.Attempt, job.MaxAttempts)
	if job.ErrorClass != "" || job.LastError != "" {
		fmt.Fprintf(tw, "last error\t[%s] %s\n", job.ErrorClass, job.LastError)
	}
	if !job.DeadlineAt.IsZero() {
		fmt.Fprintf(tw, "deadline\t%s\n", job.DeadlineAt.UTC().Format(time.RFC3339))
	}
	if job.ReplayOf != uuid.Nil {
		fmt.Fprintf(tw, "replay of\t%s (by %s: %s)\n", job.ReplayOf, job.ReplayedBy, job.ReplayReason)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ATTEMPT\tWORKER\tSTARTED\tTOOK\tOUTCOME\tCLASS\tTOKENS IN/OUT\tUNCERTAIN\tERROR")
	for _, a := range attempts {
		took, outcome := "-", string(a.Outcome)
		if !a.EndedAt.IsZero() {
			took = a.EndedAt.Sub(a.StartedAt).Round(time.Millisecond).String()
		}
		if outcome == "" {
			outcome = "(running)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%v\t%s\n", a.Attempt, a.Worker, a.StartedAt.UTC().Format(time.RFC3339),
			took, outcome, a.ErrorClass, a.Usage.InputTokens, a.Usage.OutputTokens, a.Usage.Uncertain, firstLine(a.Error))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "EVENT\tTYPE\tCREATED\tPUBLISHED")
	for _, e := range recs {
		published := "no"
		if !e.PublishedAt.IsZero() {
			published = e.PublishedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.ID, e.Type, e.CreatedAt.UTC().Format(time.RFC3339), published)
	}
	return tw.Flush()
}

// runDeadLetter lists a tenant's dead-lettered jobs, or replays one.
func runDeadLetter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: dead-letter needs list or replay", errUsage)
	}
	sub, args := args[0], args[1:]
	fs, c := newFlagSet("dead-letter "+sub, stderr)
	tenant := fs.String("tenant", "", "tenant (required: every read is tenant-scoped)")
	switch sub {
	case "list":
		limit := fs.Int("limit", 50, "how many, newest first")
		if err := parse(fs, args); err != nil {
			return err
		}
		if *tenant == "" {
			return fmt.Errorf("%w: dead-letter list needs -tenant", errUsage)
		}
		s, err := c.open(ctx)
		if err != nil {
			return err
		}
		defer s.close()
		page, err := s.jobs.List(ctx, s.pool, jobs.ListParams{Tenant: *tenant, States: []jobs.State{jobs.StateFailedTerminal}, Limit: *limit})
		if err != nil {
			return err
		}
		if c.json {
			return writeJSON(stdout, page.Jobs)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tKIND\tATTEMPTS\tFINISHED\tCLASS\tERROR")
		for _, j := range page.Jobs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", j.ID, j.Kind, j.Attempt, j.FinishedAt.UTC().Format(time.RFC3339), j.ErrorClass, firstLine(j.LastError))
		}
		return tw.Flush()
	case "replay":
		by := fs.String("by", "", "who asks for the replay (required)")
		reason := fs.String("reason", "", "why (required)")
		if err := fs.Parse(args); err != nil {
			return usageOrHelp(err)
		}
		id, err := jobArg(fs, *tenant != "" && *by != "" && *reason != "", "dead-letter replay -tenant T -by WHO -reason WHY JOB_ID")
		if err != nil {
			return err
		}
		s, err := c.open(ctx)
		if err != nil {
			return err
		}
		defer s.close()
		job, err := s.jobs.Replay(ctx, s.pool, jobs.ReplayParams{Tenant: *tenant, JobID: id, By: *by, Reason: *reason})
		if err != nil {
			return err
		}
		if c.json {
			return writeJSON(stdout, job)
		}
		fmt.Fprintf(stdout, "replayed %s as %s (%s)\n", id, job.ID, job.State)
		return nil
	default:
		return fmt.Errorf("%w: dead-letter %q: use list or replay", errUsage, sub)
	}
}

// jobArg reads the one JOB_ID argument of a command whose required flags
// are present (flagsOK), or reports usage.
func jobArg(fs *flag.FlagSet, flagsOK bool, usage string) (uuid.UUID, error) {
	if !flagsOK || fs.NArg() != 1 {
		return uuid.Nil, fmt.Errorf("%w: %s", errUsage, usage)
	}
	id, err := uuid.Parse(fs.Arg(0))
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w: %q is not a job id", errUsage, fs.Arg(0))
	}
	return id, nil
}

// session is what a command reading jobs works with: the stores for the
// chosen schema and a pool.
type session struct {
	pool   *pgxpool.Pool
	jobs   *jobs.PostgresStore
	events *outbox.Store
}

func (c *common) open(ctx context.Context) (*session, error) {
	store, err := jobs.NewStore(jobs.Config{Schema: c.schema})
	if err != nil {
		return nil, err
	}
	events, err := outbox.NewStore(outbox.Config{Schema: c.schema})
	if err != nil {
		return nil, err
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	return &session{pool: pool, jobs: store, events: events}, nil
}

func (s *session) close() { s.pool.Close() }

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
