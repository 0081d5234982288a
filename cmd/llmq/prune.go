package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/retention"
)

// retentionFlag is a flag holding a retention: a duration, whole days
// ("7d"), or "never". Unset flags leave the policy's value alone.
type retentionFlag struct {
	name, field string // the flag, and the Policy field it sets
	target      *time.Duration
	set         bool
}

func (r *retentionFlag) Set(s string) error {
	d, err := retention.ParseRetention(s)
	if err != nil {
		return err
	}
	*r.target, r.set = d, true
	return nil
}

func (r *retentionFlag) String() string {
	if r == nil || r.target == nil || *r.target == 0 {
		return ""
	}
	return retention.FormatRetention(*r.target)
}

// policyFlags adds a flag per Policy field to fs. The policy starts empty
// (defaults); the caller fills in a recorded one for the fields no flag
// set with merge.
type policyFlags struct {
	given retention.Policy
	flags []*retentionFlag
}

func addPolicyFlags(fs *flag.FlagSet) *policyFlags {
	p := &policyFlags{}
	for _, f := range []struct {
		name, field, help string
		target            *time.Duration
	}{
		{"succeeded", "Succeeded", "keep SUCCEEDED jobs this long (default 1d)", &p.given.Succeeded},
		{"review-required", "ReviewRequired", "keep REVIEW_REQUIRED jobs this long (default 30d)", &p.given.ReviewRequired},
		{"failed-terminal", "FailedTerminal", "keep FAILED_TERMINAL jobs (dead letters) this long (default 30d)", &p.given.FailedTerminal},
		{"cancelled", "Cancelled", "keep CANCELLED jobs this long (default 7d)", &p.given.Cancelled},
		{"idempotency-window", "IdempotencyWindow", "keep every finished job, and its key, at least this long (default 1d)", &p.given.IdempotencyWindow},
		{"published-events", "PublishedEvents", "keep published outbox events this long (default 1d)", &p.given.PublishedEvents},
		{"unrelayed-events", "UnrelayedEvents", "keep unpublished events this long on a host with no relay (default never)", &p.given.UnrelayedEvents},
		{"inbox-records", "InboxRecords", "remember inbox message ids this long (default 7d, at least 1h)", &p.given.InboxRecords},
		{"webhook-deliveries", "WebhookDeliveries", "keep webhook deliveries this long (default 30d, at least the delivery schedule's span plus a day)", &p.given.WebhookDeliveries},
		{"inbox-quarantine", "InboxQuarantine", "keep quarantined inbox messages this long (default 30d)", &p.given.InboxQuarantine},
	} {
		rf := &retentionFlag{name: f.name, field: "Policy." + f.field, target: f.target}
		fs.Var(rf, f.name, f.help+`: a duration (90m, 24h), days (7d) or "never"`)
		p.flags = append(p.flags, rf)
	}
	return p
}

// merge returns the policy the flags give, taking each field no flag set
// from recorded (the running service's policy), when there is one.
func (p *policyFlags) merge(recorded *retention.Policy) retention.Policy {
	out := p.given
	if recorded == nil {
		return out
	}
	base := []time.Duration{recorded.Succeeded, recorded.ReviewRequired, recorded.FailedTerminal, recorded.Cancelled,
		recorded.IdempotencyWindow, recorded.PublishedEvents, recorded.UnrelayedEvents, recorded.InboxRecords, recorded.WebhookDeliveries,
		recorded.InboxQuarantine}
	fields := []*time.Duration{&out.Succeeded, &out.ReviewRequired, &out.FailedTerminal, &out.Cancelled,
		&out.IdempotencyWindow, &out.PublishedEvents, &out.UnrelayedEvents, &out.InboxRecords, &out.WebhookDeliveries,
		&out.InboxQuarantine}
	for i, f := range p.flags {
		if !f.set {
			*fields[i] = base[i]
		}
	}
	return out
}

// recordedFlag returns the flag for the policy field err names when that
// field came from the recorded policy (no flag set it), or "".
func (p *policyFlags) recordedFlag(err error) string {
	var ce *retention.ConfigError
	if !errors.As(err, &ce) {
		return ""
	}
	for _, f := range p.flags {
		if f.field == ce.Field && !f.set {
			return f.name
		}
	}
	return ""
}

type pruneReport struct {
	DryRun bool              `json:"dry_run"`
	Policy retention.Policy  `json:"policy"`
	Rows   []retention.Count `json:"rows"` // deleted, or due in a dry run
	Holder string            `json:"holder,omitempty"`
}

// runPrune deletes (or, with --dry-run, counts) what is due under the
// retention policy: the running service's recorded policy, or the
// defaults, with any flag given taking precedence. It prunes as a one-off
// service: holding the lease while it runs (never beside the service), but
// leaving the service's recorded policy and last pass alone, so flags
// given here never become what stats shows or the next prune starts from.
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("prune", stderr)
	dryRun := fs.Bool("dry-run", false, "count what is due without deleting anything")
	batch := fs.Int("batch", 0, "rows per batch (default 1000, at most 10000)")
	pf := addPolicyFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *batch < 0 || *batch > retention.MaxBatchSize {
		return fmt.Errorf("%w: -batch %d: use 1 to %d", errInvalidInput, *batch, retention.MaxBatchSize)
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// First with the flags alone, to read what the running service records.
	host, _ := os.Hostname()
	cfg := retention.Config{Schema: c.schema, ID: fmt.Sprintf("llmq-prune/%s/%d", host, os.Getpid()), BatchSize: *batch, Policy: pf.given, OneOff: true}
	svc, err := retention.New(pool, cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errInvalidInput, err)
	}
	status, err := svc.Status(ctx)
	if err != nil {
		return err
	}
	cfg.Policy = pf.merge(status.Policy)
	if svc, err = retention.New(pool, cfg); err != nil {
		if name := pf.recordedFlag(err); name != "" {
			// A policy recorded by an earlier version can hold what this
			// one refuses (a webhook retention below today's floor).
			return fmt.Errorf("%w: the recorded policy is refused now: %w; give --%s", errInvalidInput, err, name)
		}
		return fmt.Errorf("%w: %w", errInvalidInput, err)
	}
	report := pruneReport{DryRun: *dryRun, Policy: svc.Policy(), Holder: status.Holder}
	if *dryRun {
		if report.Rows, err = svc.Due(ctx); err != nil {
			return err
		}
	} else {
		pass, err := svc.PruneOnce(ctx)
		if errors.Is(err, retention.ErrNotHolder) {
			return fmt.Errorf("the retention service %q holds the lease and prunes every interval; use --dry-run to see what is due", status.Holder)
		}
		if releaseErr := svc.Release(context.WithoutCancel(ctx)); releaseErr != nil && err == nil {
			err = releaseErr
		}
		if err != nil {
			return err
		}
		report.Rows = pass.Deleted
	}
	if report.Rows == nil {
		report.Rows = []retention.Count{}
	}
	if c.json {
		return writeJSON(stdout, report)
	}
	return printPrune(stdout, report)
}

func printPrune(w io.Writer, r pruneReport) error {
	fmt.Fprintln(w, "retention:", policyLine(r.Policy))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	verb := "DELETED"
	if r.DryRun {
		verb = "DUE"
	}
	fmt.Fprintf(tw, "TABLE\tCLASS\t%s\n", verb)
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", row.Table, orDash(row.Class), row.Rows)
	}
	if len(r.Rows) == 0 {
		fmt.Fprintln(tw, "(nothing)\t\t")
	}
	if r.DryRun {
		fmt.Fprintln(tw, "(jobs take their attempts and keys with them)\t\t")
	}
	return tw.Flush()
}

// policyLine prints a policy on one line, for people.
func policyLine(p retention.Policy) string {
	f := retention.FormatRetention
	return fmt.Sprintf("succeeded %s, review_required %s, failed_terminal %s, cancelled %s, idempotency_window %s, published_events %s, unrelayed_events %s, inbox_records %s, inbox_quarantine %s, webhook_deliveries %s",
		f(p.Succeeded), f(p.ReviewRequired), f(p.FailedTerminal), f(p.Cancelled), f(p.IdempotencyWindow),
		f(p.PublishedEvents), f(p.UnrelayedEvents), f(p.InboxRecords), f(p.InboxQuarantine), f(p.WebhookDeliveries))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
