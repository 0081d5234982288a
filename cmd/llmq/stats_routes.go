package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/jobs"
)

// defaultRoutesWindow is how far back stats' routes table looks by
// default (-routes-window).
const defaultRoutesWindow = time.Hour

// routesLimit bounds the routes table: the busiest (candidate, model)
// rows.
const routesLimit = 100

// readRoutes reads what each route candidate did with the attempts
// started in the last window, every tenant's. The store reads the attempts
// sequentially (jobs/candidates.sql): once per stats call.
func (s *session) readRoutes(ctx context.Context, window time.Duration) ([]jobs.CandidateStats, error) {
	routes, err := s.jobs.CandidateStats(ctx, s.pool, jobs.CandidateStatsParams{Since: time.Now().Add(-window), Limit: routesLimit})
	if routes == nil {
		routes = []jobs.CandidateStats{}
	}
	return routes, err
}

// printRoutes prints the routes table, or nothing when no attempt of a
// routed kind started in the window.
func printRoutes(w io.Writer, r statsReport) error {
	if len(r.Routes) == 0 {
		return nil
	}
	window := time.Duration(r.RoutesWindowSeconds * float64(time.Second))
	fmt.Fprintf(w, "\nroute candidates, attempts started in the last %s:\n", window)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "CANDIDATE\tMODEL\tATTEMPTS\tSUCCEEDED\tFAILED\tSNOOZED\tMOVED FROM\tTOKENS IN/OUT\n")
	for _, c := range r.Routes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d/%d\n", c.Candidate, orDash(c.Model), c.Attempts, c.Succeeded, c.Failed, c.Snoozed,
			movedFrom(c), c.InputTokens, c.OutputTokens)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Routes) == routesLimit {
		fmt.Fprintf(w, "(the %d busiest candidates and models)\n", routesLimit)
	}
	return nil
}

// movedFrom prints a candidate's moves with their failures, "3
// (rate_limited 2, timeout 1)", by failure name.
func movedFrom(c jobs.CandidateStats) string {
	if c.MovedFrom == 0 {
		return "0"
	}
	parts := make([]string, 0, len(c.MovedFromByFailure))
	for _, failure := range slices.Sorted(maps.Keys(c.MovedFromByFailure)) {
		parts = append(parts, fmt.Sprintf("%s %d", failure, c.MovedFromByFailure[failure]))
	}
	return fmt.Sprintf("%d (%s)", c.MovedFrom, strings.Join(parts, ", "))
}
