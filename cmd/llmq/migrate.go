package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq"
)

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: migrate needs up, down, status or sql", errUsage)
	}
	sub, args := args[0], args[1:]
	fs, c := newFlagSet("migrate "+sub, stderr)
	switch sub {
	case "up":
		to := fs.Int("to", 0, "version to migrate up to (0: the latest)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := checkVersion(fs, "to", *to); err != nil {
			return err
		}
		return migrate(ctx, c, stdout, llmq.MigrateOptions{Schema: c.schema, TargetVersion: *to})
	case "down":
		to := fs.Int("to", -1, "version to keep; migrations above it are reverted (required; 0 drops every llmq table)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if *to < 0 {
			return fmt.Errorf("%w: migrate down needs -to N (0 reverts everything)", errUsage)
		}
		if err := checkVersion(fs, "to", *to); err != nil {
			return err
		}
		return migrate(ctx, c, stdout, llmq.MigrateOptions{Schema: c.schema, Direction: llmq.DirectionDown, TargetVersion: *to})
	case "status":
		if err := parse(fs, args); err != nil {
			return err
		}
		return migrateStatus(ctx, c, stdout)
	case "sql":
		down := fs.Bool("down", false, "print the down migrations instead")
		from := fs.Int("from", -1, "version the schema is at (default: 0 for up, the latest for down)")
		to := fs.Int("to", 0, "version to end at (default: the latest for up, 0 for down)")
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := checkVersion(fs, "to", *to); err != nil {
			return err
		}
		if *from != -1 {
			if err := checkVersion(fs, "from", *from); err != nil {
				return err
			}
		}
		opts := llmq.MigrateOptions{Schema: c.schema, TargetVersion: *to}
		if *down {
			opts.Direction = llmq.DirectionDown
		}
		start := *from
		if start < 0 {
			start = 0
			if *down {
				start = llmq.LatestVersion()
			}
		}
		sql, err := llmq.MigrationSQL(opts, start)
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, sql)
		return err
	default:
		return fmt.Errorf("%w: migrate %q: use up, down, status or sql", errUsage, sub)
	}
}

// checkVersion refuses a migration version this build does not know (0
// stands for none, or the latest where the flag says so).
func checkVersion(fs *flag.FlagSet, name string, v int) error {
	if v < 0 || v > llmq.LatestVersion() {
		return fmt.Errorf("%w: %s: -%s %d: %w (known: 1..%d)", errInvalidInput, fs.Name(), name, v, llmq.ErrUnknownVersion, llmq.LatestVersion())
	}
	return nil
}

func migrate(ctx context.Context, c *common, stdout io.Writer, opts llmq.MigrateOptions) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := llmq.Migrate(ctx, pool, opts)
	if res != nil {
		if c.json {
			if jerr := writeJSON(stdout, migrateReport{Schema: opts.Schema, Direction: opts.Direction.String(), Migrations: res.Migrations}); jerr != nil {
				return jerr
			}
		} else {
			for _, m := range res.Migrations {
				fmt.Fprintf(stdout, "%s %s: %04d_%s\n", opts.Direction, opts.Schema, m.Version, m.Name)
			}
			if len(res.Migrations) == 0 && err == nil {
				fmt.Fprintf(stdout, "%s %s: nothing to do\n", opts.Direction, opts.Schema)
			}
		}
	}
	return err
}

type migrateReport struct {
	Schema     string           `json:"schema"`
	Direction  string           `json:"direction"`
	Migrations []llmq.Migration `json:"migrations"`
}

type migrationRow struct {
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
	Known     bool       `json:"known"`
	Changed   bool       `json:"changed"`
}

func migrateStatus(ctx context.Context, c *common, stdout io.Writer) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	states, err := llmq.MigrationStatus(ctx, pool, llmq.MigrateOptions{Schema: c.schema})
	if err != nil {
		return err
	}
	rows := make([]migrationRow, 0, len(states))
	for _, s := range states {
		r := migrationRow{Version: s.Version, Name: s.Name, Applied: s.Applied(), Known: s.Known, Changed: s.Changed}
		if s.Applied() {
			at := s.AppliedAt
			r.AppliedAt = &at
		}
		rows = append(rows, r)
	}
	if c.json {
		return writeJSON(stdout, struct {
			Schema     string         `json:"schema"`
			Migrations []migrationRow `json:"migrations"`
		}{c.schema, rows})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "VERSION\tNAME\tSTATUS\tAPPLIED AT\n")
	for _, r := range rows {
		status, at := "pending", "-"
		if r.Applied {
			status, at = "applied", r.AppliedAt.UTC().Format(time.RFC3339)
		}
		if !r.Known {
			status += " (unknown to this build)"
		}
		if r.Changed {
			status += " (CHANGED: applied from other SQL than this build's)"
		}
		fmt.Fprintf(tw, "%04d\t%s\t%s\t%s\n", r.Version, r.Name, status, at)
	}
	return tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
