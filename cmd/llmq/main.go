// Command llmq is the operator CLI for an llmq installation: schema
// migrations and queue statistics, with tables for people and --json for
// scripts.
//
//	llmq migrate up [-to N]         apply pending migrations (every replica may run it at once)
//	llmq migrate down -to N         revert migrations above version N (0 drops every llmq table)
//	llmq migrate status             list migrations and whether each is applied
//	llmq migrate sql [-down] [-from N] [-to N]
//	                                print the SQL, for teams that run their own migration tool
//	llmq stats                      jobs by queue and state, oldest eligible job age
//	llmq inspect -tenant T JOB_ID   a job, its attempts and its events
//	llmq dead-letter list -tenant T
//	llmq dead-letter replay -tenant T -by WHO -reason WHY JOB_ID
//	llmq bench -mode drain|e2e|latency|relay|ingress|admission -jobs N -workers W [flags]
//	                                measure against DATABASE_URL in a throwaway schema
//	llmq plan -rpm R -tpm T -concurrency C [-latency D] [-tokens N] [-backlog B] [-pool P]
//	                                attempt and job capacity, drain time of a backlog
//
// Every command takes -database-url (default $DATABASE_URL), -schema
// (default $LLMQ_SCHEMA, else "llmq") and --json.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: llmq <command> [flags]

commands:
  migrate up [-to N]                     apply pending migrations
  migrate down -to N                     revert migrations above version N
  migrate status                         list migrations and whether each is applied
  migrate sql [-down] [-from N] [-to N]  print the migration SQL
  stats                                  jobs by queue and state
  inspect -tenant T JOB_ID               a job, its attempts and its events
  dead-letter list -tenant T             the tenant's dead-lettered jobs
  dead-letter replay -tenant T -by WHO -reason WHY JOB_ID
                                         run a finished job again as a new, linked job
  bench -mode drain|e2e|latency|relay|ingress|admission
                                         measure throughput, latency or admission grants in a throwaway schema
  plan -rpm R -tpm T -concurrency C [-pool P]
                                         capacity and drain time of a backlog under provider limits

Run 'llmq <command> -h' for a command's flags.
`

// errUsage marks errors caused by how the command was called (exit 2).
var errUsage = errors.New("usage")

// run is main without the process: it parses args, runs one command and
// returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "migrate":
		err = runMigrate(ctx, args[1:], stdout, stderr)
	case "stats":
		err = runStats(ctx, args[1:], stdout, stderr)
	case "bench":
		err = runBench(ctx, args[1:], stdout, stderr)
	case "inspect":
		err = runInspect(ctx, args[1:], stdout, stderr)
	case "dead-letter":
		err = runDeadLetter(ctx, args[1:], stdout, stderr)
	case "plan":
		err = runPlan(ctx, args[1:], stdout, stderr)
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "llmq: %v\n\n%s", err, usage)
		return 2
	default:
		fmt.Fprintf(stderr, "llmq: %v\n", err)
		return 1
	}
}

// common holds the flags every command takes.
type common struct {
	databaseURL string
	schema      string
	json        bool
}

func newFlagSet(name string, stderr io.Writer) (*flag.FlagSet, *common) {
	fs := flag.NewFlagSet("llmq "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &common{}
	fs.StringVar(&c.databaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL connection URL")
	fs.StringVar(&c.schema, "schema", envOr("LLMQ_SCHEMA", "llmq"), "Postgres schema holding the llmq tables")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	return fs, c
}

// parse parses args and refuses stray positional arguments.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return usageOrHelp(err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s: unexpected argument %q", errUsage, fs.Name(), fs.Arg(0))
	}
	return nil
}

// usageOrHelp passes -h through and marks other flag errors as usage errors.
func usageOrHelp(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w: %w", errUsage, err)
}

func (c *common) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", cfg.ConnConfig.Host, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
