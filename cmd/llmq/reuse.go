package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// runReuse dispatches the result reuse commands: record an invalidation,
// and list them.
func runReuse(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand("reuse", args, "invalidate", "list")
	if err != nil {
		return err
	}
	if sub == "invalidate" {
		return runReuseInvalidate(ctx, args, stdout, stderr)
	}
	return runReuseList(ctx, args, stdout, stderr)
}

// runReuseInvalidate records an invalidation: no result it covers that
// was computed by an attempt started until now is reused again.
func runReuseInvalidate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("reuse invalidate", stderr)
	kind := fs.String("kind", "", "the kind whose results are not to be reused again (required)")
	key := fs.String("key", "", "only the results of this reuse key (default: every key of the kind)")
	tenant := fs.String("tenant", "", "only the results computed by this tenant's jobs (default: every tenant's)")
	by := fs.String("by", "", "who invalidates, recorded with the invalidation (required)")
	reason := fs.String("reason", "", "why, recorded with the invalidation (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	p := jobs.InvalidateReuseParams{Kind: *kind, Key: *key, Tenant: *tenant, By: *by, Reason: *reason}
	if err := checkInvalidation(p, setFlags(fs)); err != nil {
		return err
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	inv, covered, err := s.jobs.InvalidateReuse(ctx, s.pool, p)
	if err != nil {
		return nameReuseFlag(err)
	}
	if c.json {
		return writeJSON(stdout, invalidationJSON{ReuseInvalidation: inv, Covered: covered})
	}
	if err := printInvalidations(stdout, []jobs.ReuseInvalidation{inv}); err != nil {
		return err
	}
	// covered counts finished results; an attempt running now started
	// before the cut too, so its result is not reused either.
	fmt.Fprintf(stdout, "computed results covered: %d (finished in the last %d days, the longest TTL); no claim reuses them again, "+
		"nor the result of an attempt running now; results of attempts that start later are reused as before\n",
		covered, int(jobs.MaxReuseTTL/(24*time.Hour)))
	return nil
}

// checkInvalidation refuses, before connecting, an invalidation missing
// what it must record, and an empty -key or -tenant given on purpose:
// an empty shell variable would otherwise widen the cut to every key or
// every tenant.
func checkInvalidation(p jobs.InvalidateReuseParams, set map[string]bool) error {
	switch {
	case p.Kind == "":
		return fmt.Errorf("%w: reuse invalidate: -kind K is required: the kind whose results are not to be reused again", errUsage)
	case strings.TrimSpace(p.By) == "":
		return fmt.Errorf("%w: reuse invalidate: -by WHO is required: it is recorded with the invalidation", errUsage)
	case strings.TrimSpace(p.Reason) == "":
		return fmt.Errorf("%w: reuse invalidate: -reason WHY is required: it is recorded with the invalidation", errUsage)
	case set["key"] && p.Key == "":
		return fmt.Errorf("%w: reuse invalidate: -key is empty; leave it out to invalidate every key of the kind", errInvalidInput)
	case set["tenant"] && p.Tenant == "":
		return fmt.Errorf("%w: reuse invalidate: -tenant is empty; leave it out to invalidate every tenant's results", errInvalidInput)
	}
	return nil
}

// invalidationFlags names the flag that sets each field of
// jobs.InvalidateReuseParams.
var invalidationFlags = map[string]string{"Kind": "-kind", "Key": "-key", "Tenant": "-tenant", "By": "-by", "Reason": "-reason"}

// nameReuseFlag rewords the store's refusal of a field as a refusal of
// the flag that set it; the operator typed flags, not Go fields.
func nameReuseFlag(err error) error {
	ve, ok := errors.AsType[*llmqtype.ValidationError](err)
	if !ok {
		return err
	}
	name, ok := invalidationFlags[ve.Field]
	if !ok {
		return err
	}
	return fmt.Errorf("%w: reuse invalidate: %s %s", errInvalidInput, name, ve.Problem)
}

// runReuseList prints the invalidations, newest first.
func runReuseList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("reuse list", stderr)
	kind := fs.String("kind", "", "only this kind's invalidations")
	limit := fs.Int("limit", 50, fmt.Sprintf("how many, newest first (1 to %d)", jobs.MaxListLimit))
	if err := parse(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > jobs.MaxListLimit {
		return fmt.Errorf("%w: reuse list: -limit is %d; use 1 to %d", errUsage, *limit, jobs.MaxListLimit)
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	list, err := s.jobs.ReuseInvalidations(ctx, s.pool, *kind, *limit)
	if err != nil {
		return err
	}
	if c.json {
		if list == nil {
			list = []jobs.ReuseInvalidation{}
		}
		return writeJSON(stdout, list)
	}
	return printInvalidations(stdout, list)
}

// invalidationJSON is what reuse invalidate --json prints: the
// invalidation, and how many computed results it covers.
type invalidationJSON struct {
	jobs.ReuseInvalidation
	Covered int64 `json:"covered"`
}

func printInvalidations(w io.Writer, list []jobs.ReuseInvalidation) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAT\tKIND\tKEY\tTENANT\tBY\tREASON")
	for _, inv := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", inv.ID, inv.At.UTC().Format(time.RFC3339), inv.Kind,
			cmp.Or(inv.Key, "every key"), cmp.Or(inv.Tenant, "every tenant"), inv.By, inv.Reason)
	}
	if len(list) == 0 {
		fmt.Fprintln(tw, "(no reuse invalidations)")
	}
	return tw.Flush()
}
