package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/providerbatch"
)

// runBatches dispatches the provider batch commands: the submissions
// package providerbatch recorded, and a request to cancel one.
func runBatches(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand("batches", args, "list", "cancel")
	if err != nil {
		return err
	}
	if sub == "cancel" {
		return runBatchesCancel(ctx, args, stdout, stderr)
	}
	return runBatchesList(ctx, args, stdout, stderr)
}

// runBatchesList prints the newest submissions, every pool's unless -pool.
func runBatchesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("batches list", stderr)
	pool := fs.String("pool", "", "only this provider pool's submissions")
	limit := fs.Int("limit", 50, fmt.Sprintf("how many, newest first (1 to %d)", providerbatch.MaxListLimit))
	if err := parse(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > providerbatch.MaxListLimit {
		return fmt.Errorf("%w: batches list: -limit is %d; use 1 to %d", errUsage, *limit, providerbatch.MaxListLimit)
	}
	return withOperator(ctx, c, func(o *providerbatch.Operator, db *pgxpool.Pool) error {
		subs, err := o.List(ctx, db, *pool, *limit)
		if err != nil {
			return explainBatches(err, c.schema)
		}
		return printBatches(stdout, c.json, subs, time.Now())
	})
}

// runBatchesCancel asks the submitter of a submission's pool to cancel its
// provider batch at its next poll.
func runBatchesCancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("batches cancel", stderr)
	pos, err := parseArgs(fs, args, 1, "batches cancel needs a submission id: batches cancel ID ('llmq batches list' shows them)")
	if err != nil {
		return err
	}
	id, err := uuid.Parse(pos[0])
	if err != nil {
		return fmt.Errorf("%w: batches cancel: %q is not a submission id (a UUID; 'llmq batches list' shows them)", errUsage, pos[0])
	}
	return withOperator(ctx, c, func(o *providerbatch.Operator, db *pgxpool.Pool) error {
		if err := o.Cancel(ctx, db, id); err != nil {
			if errors.Is(err, providerbatch.ErrNotFound) {
				return fmt.Errorf("batches cancel: no open submission %s: none has that id, or it has ended ('llmq batches list' shows each submission's state): %w",
					id, providerbatch.ErrNotFound)
			}
			return explainBatches(err, c.schema)
		}
		if c.json {
			return writeJSON(stdout, batchCancelJSON{ID: id, CancelRequested: true})
		}
		fmt.Fprintf(stdout, "cancel requested for submission %s; the submitter cancels the provider batch at its next poll, and jobs the provider did not answer return to waiting\n", id)
		return nil
	})
}

// withOperator connects and runs fn with an Operator on the schema's
// provider batch tables.
func withOperator(ctx context.Context, c *common, fn func(*providerbatch.Operator, *pgxpool.Pool) error) error {
	o, err := providerbatch.NewOperator(c.schema)
	if err != nil {
		return err
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	return fn(o, pool)
}

// batchCancelJSON is what batches cancel --json prints.
type batchCancelJSON struct {
	ID              uuid.UUID `json:"id"`
	CancelRequested bool      `json:"cancel_requested"`
}

// explainBatches says the fix for a schema without the provider batch
// tables (never migrated, or not to migration 0023).
func explainBatches(err error, schema string) error {
	return dbsql.Explain(err, schema, "-schema")
}

func printBatches(w io.Writer, asJSON bool, subs []providerbatch.Submission, now time.Time) error {
	if asJSON {
		if subs == nil {
			subs = []providerbatch.Submission{}
		}
		return writeJSON(w, subs)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPOOL\tMODEL\tSTATE\tPROVIDER BATCH\tPROVIDER STATUS\tREQUESTS\tSUCCEEDED\tFAILED\tSTALE\tRETURNED\tSKIPPED\tAGE\tCANCEL\tERROR")
	for _, s := range subs {
		cancel := "-"
		if s.CancelRequested {
			cancel = "requested"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.ID, s.Pool, s.Model, s.State,
			orDash(s.ProviderBatchID), orDash(s.ProviderStatus), s.Requests, s.Succeeded, s.Failed, s.Stale, s.Returned, s.Skipped,
			age(now.Sub(s.CreatedAt).Seconds()), cancel, firstLine(s.LastError))
	}
	if len(subs) == 0 {
		fmt.Fprintln(tw, "(no provider batch submissions)")
	}
	return tw.Flush()
}
