package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/retention"
)

// readRetention reads what stats shows of retention: the lease, the
// policy in force, the last pass and the oldest row per table, each an
// index probe, so stats stays fast at any history size.
func (s *session) readRetention(ctx context.Context, schema string) (retention.Status, error) {
	svc, err := retention.New(s.pool, retention.Config{Schema: schema, ID: "llmq-stats"})
	if err != nil {
		return retention.Status{}, err
	}
	return svc.Status(ctx)
}

// printOutbox prints the outbox's backlog: lag where a relay runs, and
// plainly a count of events nobody publishes where none ever ran.
func printOutbox(w io.Writer, r statsReport) {
	count := strconv.FormatInt(r.Outbox.Unpublished, 10)
	if r.Outbox.AtLeast {
		count = "at least " + count
	}
	if r.Retention.Relay.Acquisitions == 0 && r.Outbox.Unpublished > 0 {
		fmt.Fprintf(w, "\noutbox: %s unpublished, oldest %s (no relay has run on this schema, so this is not lag; retention: unrelayed_events %s)\n\n",
			count, age(r.Outbox.OldestUnpublishedAgeSeconds), keptFor(r.Retention.Policy, func(p retention.Policy) time.Duration { return p.UnrelayedEvents }))
		return
	}
	fmt.Fprintf(w, "\noutbox: %s unpublished, oldest %s\n\n", count, age(r.Outbox.OldestUnpublishedAgeSeconds))
}

// keptFor prints one retention of the recorded policy, or the default's
// when no service recorded one.
func keptFor(p *retention.Policy, field func(retention.Policy) time.Duration) string {
	if p == nil {
		return retention.FormatRetention(field(retention.DefaultPolicy())) + " (default)"
	}
	return retention.FormatRetention(field(*p))
}

// printRetention prints the retention section of stats.
func printRetention(w io.Writer, st retention.Status) error {
	fmt.Fprintln(w)
	if st.Policy == nil {
		fmt.Fprintln(w, "retention: no retention service has recorded a policy on this schema; nothing is pruned but by llmq prune (defaults:", policyLine(retention.DefaultPolicy())+")")
	} else {
		holder := "no process holds the lease now; the last holder's policy"
		if st.Held { // by the database's clock, which the holder renews by
			holder = "lease held by " + st.Holder
		}
		fmt.Fprintf(w, "retention: %s: %s\n", holder, policyLine(*st.Policy))
		if st.LastPass != nil {
			fmt.Fprintf(w, "last pass: %s ago, %d rows in %d batches, took %s\n",
				st.Now.Sub(st.LastPassAt).Round(time.Second), st.LastPass.Total(), st.LastPass.Batches, st.LastPass.Duration.Round(time.Millisecond))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "TABLE\tCLASS\tROWS\tOLDEST\n")
	estimated := false
	for _, o := range st.Oldest {
		oldest := "-"
		if !o.At.IsZero() {
			oldest = st.Now.Sub(o.At).Round(time.Second).String() + " ago"
		}
		rows := "-"
		switch {
		case o.Estimated:
			rows, estimated = fmt.Sprintf("~%d", o.Rows), true
		case o.Rows >= 0:
			rows = strconv.FormatInt(o.Rows, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", o.Table, orDash(o.Class), rows, oldest)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if estimated {
		fmt.Fprintf(w, "(~: estimated from the planner's statistics, as fresh as the last ANALYZE; counted exactly up to %d)\n", jobs.ExactSizeLimit)
	}
	return nil
}
