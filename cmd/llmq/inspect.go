package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
)

// runJobs dispatches the job commands.
func runJobs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand("jobs", args, "list", "inspect", "cancel")
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		return runJobsList(ctx, args, stdout, stderr)
	case "cancel":
		return runJobsCancel(ctx, args, stdout, stderr)
	}
	return runInspect(ctx, "jobs inspect", args, stdout, stderr)
}

// runInspect prints one job with its attempt history, its durable steps
// and its events. An
// operator finds a job by id alone; -tenant narrows the search to a tenant.
func runInspect(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	c, s, job, err := openJobArg(ctx, name, args, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	id := job.ID
	attempts, err := s.jobs.Attempts(ctx, s.pool, job.Tenant, id)
	if err != nil {
		return err
	}
	steps, err := s.jobs.Steps(ctx, s.pool, job.Tenant, id)
	if err != nil {
		return err
	}
	recs, err := s.events.ListByAggregate(ctx, s.pool, id)
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(stdout, map[string]any{"job": job, "attempts": attempts, "steps": steps, "events": recs})
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
	printReuse(tw, job)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ATTEMPT\tWORKER\tSTARTED\tTOOK\tOUTCOME\tCLASS\tSERVED BY\tTOKENS IN/OUT\tUNCERTAIN\tERROR")
	for _, a := range attempts {
		took, outcome := "-", string(a.Outcome)
		if !a.EndedAt.IsZero() {
			took = a.EndedAt.Sub(a.StartedAt).Round(time.Millisecond).String()
		}
		switch {
		case outcome == "":
			outcome = "(running)"
		case a.ReusedFrom != uuid.Nil:
			outcome += " from " + a.ReusedFrom.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%v\t%s\n", a.Attempt, a.Worker, a.StartedAt.UTC().Format(time.RFC3339),
			took, outcome, a.ErrorClass, servedBy(a.Candidate, a.Model), a.Usage.InputTokens, a.Usage.OutputTokens, a.Usage.Uncertain, firstLine(a.Error))
		for _, m := range a.Moves {
			fmt.Fprintf(tw, "\t\t\t\tmoved on from\t%s\t%s\t%d/%d\t%v\t%s\n", m.Failure, servedBy(m.Candidate, m.Model),
				m.InputTokens, m.OutputTokens, m.Uncertain, firstLine(m.Error))
		}
	}
	if len(attempts) == 0 {
		fmt.Fprintln(tw, "(none yet)")
	}
	if len(steps) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "STEP	RUN BY ATTEMPT	REUSED BY	TOKENS IN/OUT	STORED")
		for _, st := range steps {
			reused := make([]string, len(st.ReusedBy))
			for i, a := range st.ReusedBy {
				reused[i] = strconv.Itoa(a)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d/%d\t%s\n", st.Name, st.Attempt, cmp.Or(strings.Join(reused, ","), "-"),
				st.Usage.InputTokens, st.Usage.OutputTokens, st.CreatedAt.UTC().Format(time.RFC3339))
		}
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

// servedBy names a route candidate and its model, or "-" for an attempt
// without a route.
func servedBy(candidate, model string) string {
	if candidate == "" {
		return "-"
	}
	return candidate + " (" + model + ")"
}

// printReuse shows the job's reuse key, scope and TTL when it opted in,
// and the job whose result it took instead of calling its handler.
func printReuse(tw io.Writer, job *jobs.Job) {
	if r := job.Reuse; r != nil {
		scope := "tenant"
		if r.Shared {
			scope = "shared"
		}
		fmt.Fprintf(tw, "reuse\t%s (%s scope, TTL %s)\n", r.Key, scope, r.TTL)
	}
	if job.ReusedFrom != uuid.Nil {
		fmt.Fprintf(tw, "reused from\t%s (its result, the handler not called)\n", job.ReusedFrom)
	}
}

// runDead lists dead-lettered jobs, or replays one. name is the command
// as typed: "dead" or its older name "dead-letter".
func runDead(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand(name, args, "list", "replay")
	if err != nil {
		return err
	}
	fs, c := newFlagSet(name+" "+sub, stderr)
	tenant := fs.String("tenant", "", "only this tenant's jobs")
	if sub == "list" {
		limit := fs.Int("limit", 50, fmt.Sprintf("how many, newest first (1 to %d)", jobs.MaxListLimit))
		if err := parse(fs, args); err != nil {
			return err
		}
		if *limit < 1 || *limit > jobs.MaxListLimit {
			return fmt.Errorf("%w: %s: -limit is %d; use 1 to %d", errUsage, fs.Name(), *limit, jobs.MaxListLimit)
		}
		return deadList(ctx, c, *tenant, *limit, stdout)
	}
	by := fs.String("by", "", "who asks for the replay, recorded on the new job (default: the OS user name)")
	reason := fs.String("reason", "", "why, recorded on the new job (required)")
	deadline := fs.Duration("deadline", 0, "the new job's deadline, from now (default: none)")
	again := fs.Bool("again", false, "replay even if the job was replayed before: another new job (default: a job replayed before returns its first replay)")
	usage := sub + " needs a job id: " + name + " replay ID --reason WHY [--by WHO] [--again]"
	pos, err := parseArgs(fs, args, 1, usage)
	if err != nil {
		return err
	}
	id, err := parseJobID(pos[0])
	if err != nil {
		return err
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%w: %s: --reason WHY is required: it is recorded with the replay", errUsage, fs.Name())
	}
	if *deadline < 0 {
		return fmt.Errorf("%w: %s: -deadline is %s; it must not be negative", errUsage, fs.Name(), *deadline)
	}
	if *by == "" {
		if *by, err = osUser(); err != nil {
			return fmt.Errorf("%w: %s: --by WHO is needed: %w", errUsage, fs.Name(), err)
		}
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	old, err := s.findJob(ctx, *tenant, id)
	if err != nil {
		return err
	}
	p := jobs.ReplayParams{Tenant: old.Tenant, JobID: id, By: *by, Reason: *reason, Again: *again}
	if *deadline > 0 {
		p.DeadlineAt = time.Now().Add(*deadline)
	}
	res, err := s.jobs.Replay(ctx, s.pool, p)
	if err != nil {
		return err
	}
	job := res.Job
	if c.json {
		return writeJSON(stdout, replayJSON{Job: job, Existing: res.Existing})
	}
	if res.Existing {
		fmt.Fprintf(stdout, "%s was already replayed as %s (%s), by %s: %s; nothing was written (--again replays it once more)\n",
			id, job.ID, job.State, job.ReplayedBy, job.ReplayReason)
		return nil
	}
	fmt.Fprintf(stdout, "replayed %s as %s (%s), by %s: %s\n", id, job.ID, job.State, job.ReplayedBy, job.ReplayReason)
	return nil
}

// replayJSON is what dead replay --json prints: the replay job, and
// whether it is an earlier replay that was returned rather than created.
type replayJSON struct {
	*jobs.Job
	Existing bool `json:"existing"`
}

func deadList(ctx context.Context, c *common, tenant string, limit int, stdout io.Writer) error {
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	var dead []*jobs.Job
	if tenant != "" {
		page, err := s.jobs.List(ctx, s.pool, jobs.ListParams{Tenant: tenant, States: []jobs.State{jobs.StateFailedTerminal}, Limit: limit})
		if err != nil {
			return err
		}
		dead = page.Jobs
	} else if dead, err = s.jobs.DeadLetters(ctx, s.pool, limit); err != nil {
		return err
	}
	if c.json {
		if dead == nil {
			dead = []*jobs.Job{}
		}
		return writeJSON(stdout, dead)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tTENANT\tKIND\tQUEUE\tATTEMPTS\tFINISHED\tCLASS\tERROR")
	for _, j := range dead {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", j.ID, j.Tenant, j.Kind, j.Queue, j.Attempt,
			j.FinishedAt.UTC().Format(time.RFC3339), j.ErrorClass, firstLine(j.LastError))
	}
	if len(dead) == 0 {
		fmt.Fprintln(tw, "(no dead-lettered jobs)")
	}
	return tw.Flush()
}

// parseJobID reads a JOB_ID argument.
func parseJobID(arg string) (uuid.UUID, error) {
	id, err := uuid.Parse(arg)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w: %q is not a job id (a UUID)", errUsage, arg)
	}
	return id, nil
}

// osUser names the person running the command, for --by.
func osUser() (string, error) {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	if name := os.Getenv("USER"); name != "" {
		return name, nil
	}
	return "", errors.New("the OS user name is unknown")
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

// openJobArg parses the arguments of a command that takes one job id and
// -tenant (name ID [-tenant T]), opens the store and finds the job. The
// caller closes the session.
func openJobArg(ctx context.Context, name string, args []string, stderr io.Writer) (*common, *session, *jobs.Job, error) {
	fs, c := newFlagSet(name, stderr)
	tenant := fs.String("tenant", "", "look only among this tenant's jobs")
	pos, err := parseArgs(fs, args, 1, name+" needs a job id: "+name+" ID [-tenant T]")
	if err != nil {
		return nil, nil, nil, err
	}
	id, err := parseJobID(pos[0])
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := c.open(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	job, err := s.findJob(ctx, *tenant, id)
	if err != nil {
		s.close()
		return nil, nil, nil, err
	}
	return c, s, job, nil
}

func (s *session) close() { s.pool.Close() }

// findJob returns the job with id: tenant's when tenant is given, else
// whichever tenant's it is.
func (s *session) findJob(ctx context.Context, tenant string, id uuid.UUID) (*jobs.Job, error) {
	if tenant != "" {
		return s.jobs.Get(ctx, s.pool, tenant, id)
	}
	return s.jobs.Lookup(ctx, s.pool, id)
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
