package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/jobs"
)

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("stats", stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	stats, err := s.jobs.Stats(ctx, s.pool)
	if err != nil {
		return err
	}
	if c.json {
		type queueJSON struct {
			Queue                    string               `json:"queue"`
			Counts                   map[jobs.State]int64 `json:"counts"`
			OldestEligibleAgeSeconds float64              `json:"oldest_eligible_age_seconds"`
		}
		out := make([]queueJSON, 0, len(stats))
		for _, s := range stats {
			out = append(out, queueJSON{s.Queue, s.Counts, s.OldestEligibleAge.Seconds()})
		}
		return writeJSON(stdout, out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "QUEUE\t")
	for _, st := range jobs.States() {
		fmt.Fprintf(tw, "%s\t", st)
	}
	fmt.Fprint(tw, "OLDEST ELIGIBLE\t\n")
	for _, s := range stats {
		fmt.Fprintf(tw, "%s\t", s.Queue)
		for _, st := range jobs.States() {
			fmt.Fprintf(tw, "%d\t", s.Counts[st])
		}
		fmt.Fprintf(tw, "%s\t\n", s.OldestEligibleAge.Round(time.Millisecond))
	}
	if len(stats) == 0 {
		fmt.Fprint(tw, "(no jobs)\t\n")
	}
	return tw.Flush()
}
