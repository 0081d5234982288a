// Command llmq is the operator CLI for an llmq installation: schema
// migrations, queue and tenant statistics, job inspection, dead-letter
// replay, result reuse invalidations, and the tenant and provider-pool
// limits that are stored as data (a change applies on every process at its
// next claim, acceptance or acquire, without a restart). Read commands
// print tables for people and, with --json, JSON for scripts; set commands
// print the resulting row.
//
//	llmq migrate up [-to N]         apply pending migrations (every replica may run it at once)
//	llmq migrate down -to N         revert migrations above version N (0 drops every llmq table)
//	llmq migrate status             list migrations and whether each is applied
//	llmq migrate sql [-down] [-from N] [-to N]
//	                                print the SQL, for teams that run their own migration tool
//	llmq stats [-routes-window D]   jobs by queue and state, oldest eligible job age, outbox
//	                                lag, each tenant's backlog, in-flight jobs, weight and cap,
//	                                each kind's backlog (a kind no runner serves only ages), and
//	                                what each route candidate did in the last hour (or D)
//	llmq jobs list [-tenant T] [-state S,...] [-kind K] [-limit N] [-cursor C]
//	                                jobs newest first, every tenant's unless -tenant; the last
//	                                line gives the -cursor of the next page
//	llmq jobs inspect ID [-tenant T]
//	                                a job, its attempts with their outcomes, and its events
//	llmq jobs cancel ID [-tenant T]
//	                                cancel a waiting job, or ask a running one's runner to
//	llmq dead list [-tenant T] [-limit N]
//	                                dead-lettered (FAILED_TERMINAL) jobs, newest first
//	llmq dead replay ID --reason WHY [--by WHO] [-tenant T] [-deadline D] [--again]
//	                                run a finished job again as a new job linked to it; the
//	                                dead job is left unchanged; --by defaults to the OS user;
//	                                a job replayed before returns its first replay unless --again
//	llmq tenants list               weights, in-flight caps and acceptance quotas
//	llmq tenants set TENANT [--weight W] [--max-in-flight N] [--max-pending-jobs N]
//	                     [--max-pending-bytes N] [--max-pending-tokens N] [--max-daily-cost N]
//	                                change only the limits given; 0 means no cap or quota
//	llmq tenants set --defaults [--weight W] [--max-in-flight N]
//	                                the weight and cap of tenants without their own
//	llmq tenants reset TENANT       drop the tenant's own limits and quota: the defaults apply
//	llmq pools list                 provider pools: limits, in flight, bucket levels, cooldown
//	llmq pools set POOL [--rpm R] [--tpm T] [--in-flight N] [--create] [flags]
//	                                change only the limits given (--create for a new pool)
//	llmq batches list [--pool P] [--limit N]
//	                                provider batch submissions, newest first: state, the
//	                                provider's batch id and status, requests as settled so far
//	llmq batches cancel ID          ask the pool's submitter to cancel a provider batch at its
//	                                next poll; the jobs it did not answer return to waiting
//	llmq reuse invalidate -kind K [-key KEY] [-tenant T] -by WHO -reason WHY
//	                                never reuse again the results of kind K (of KEY, of T's
//	                                jobs) whose attempt started by now; prints how many it covers
//	llmq reuse list [-kind K] [-limit N]
//	                                the invalidations, newest first
//	llmq schedules list             periodic jobs (package schedule): when, next and last slot
//	llmq schedules pause|resume NAME
//	                                stop or restart a schedule; resuming skips the slots missed
//	llmq bench -mode drain|e2e|latency|relay|ingress|admission|providerbatch|reuse -jobs N -workers W [flags]
//	                                measure against DATABASE_URL in a throwaway schema
//	llmq plan -rpm R -tpm T -concurrency C [-latency D] [-tokens N] [-backlog B] [-pool P]
//	                                attempt and job capacity, drain time of a backlog; with
//	                                -pool, the limits given explicitly win over the pool's
//	llmq version                    this build's llmq version
//
// "inspect" and "dead-letter" are the older names of "jobs inspect" and
// "dead", and still work.
//
// A usage error prints one line naming what was wrong and a hint, not the
// whole help; -h prints the commands, '<command> -h' a command's flags.
//
// Every command takes -database-url (default $DATABASE_URL), -schema
// (default $LLMQ_SCHEMA, else "llmq") and --json. Flags may be written -flag
// or --flag, before or after the positional arguments. Refused input exits
// 2 with a message naming it, before anything is written: an unknown
// command or flag, a malformed id, a negative limit, a schema, tenant or
// pool name llmq refuses or a malformed -database-url (checked before
// connecting), any other value llmq's packages refuse (their
// ValidationError), a migration version this build does not know, an
// unknown pool. Exit 1 is for what the database said or
// did (a job not found, no open provider batch submission with the id, a
// version applied by a newer build, a refused statement, no connection).
//
// Operator commands are not tenant-scoped: a job is found by its id alone,
// and -tenant, where given, narrows the search to that tenant.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
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
  stats [-routes-window D]               queues by state, outbox lag, per-tenant and per-kind backlog,
                                         route candidates over the last hour (or D)
  jobs list [-tenant T] [-state S,...] [-kind K] [-limit N] [-cursor C]
                                         jobs newest first, filtered; paged with -cursor
  jobs inspect ID [-tenant T]            a job, its attempts, its steps and its events
  jobs cancel ID [-tenant T]             cancel a waiting job, or ask a running one's runner to
  dead list [-tenant T] [-limit N]       dead-lettered jobs, newest first
  dead replay ID --reason WHY [--by WHO] [-tenant T] [-deadline D] [--again]
                                         run a dead job again as a new, linked job
                                         (once: a second replay returns the first unless --again)
  tenants list                           tenants' weights, in-flight caps and quotas
  tenants set TENANT [--weight W] [--max-in-flight N] [--max-pending-jobs N]
                     [--max-pending-bytes N] [--max-pending-tokens N] [--max-daily-cost N]
                                         change a tenant's limits (only those given)
  tenants set --defaults [--weight W] [--max-in-flight N]
                                         the limits of tenants without their own
  tenants reset TENANT                   drop a tenant's own limits and quota
  pools list                             provider pools: limits, in flight, cooldown
  pools set POOL [--rpm R] [--tpm T] [--in-flight N] [--create] [flags]
                                         change a pool's limits (only those given)
  batches list [--pool P] [--limit N]    provider batch submissions, newest first
  batches cancel ID                      cancel a provider batch at its submitter's next poll
  reuse invalidate -kind K [-key KEY] [-tenant T] -by WHO -reason WHY
                                         never reuse a kind's results computed so far (-key, -tenant narrow it)
  reuse list [-kind K] [-limit N]        result reuse invalidations, newest first
  schedules list                         periodic jobs with their next and last slots
  schedules pause|resume NAME            stop or restart a schedule (resuming skips the slots missed)
  bench -mode drain|e2e|latency|relay|ingress|admission|providerbatch|reuse
                                         measure throughput, latency, admission grants or provider batches in a throwaway schema
  plan -rpm R -tpm T -concurrency C [-pool P]
                                         capacity and drain time of a backlog under provider limits
  prune [--dry-run] [--succeeded D] [--failed-terminal D] [...]
                                         delete (or count) what retention says is due
  console [-addr A] [-tenant T] [-actions]  the operator web console (read-only without -actions)
  version                                this build's llmq version

aliases: inspect = jobs inspect, dead-letter = dead.
Every command takes -database-url URL, -schema NAME and --json; flags may
follow positional arguments. Run 'llmq <command> -h' for a command's flags.
`

// usageHint follows a usage error's one line.
const usageHint = "run 'llmq -h' for the commands, 'llmq <command> -h' for a command's flags"

// errUsage marks errors caused by how the command was called (exit 2).
var errUsage = errors.New("usage")

// errHelpUsage asks for the usage text, which is not an error (exit 0).
var errHelpUsage = errors.New("help")

// errFlag marks a flag the flag package refused; it has already printed
// the problem and the command's flags (exit 2).
var errFlag = errors.New("bad flag")

// errInvalidInput marks a value the command refuses, named in the message
// without the usage text (exit 2).
var errInvalidInput = errors.New("invalid input")

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
	case "jobs":
		err = runJobs(ctx, args[1:], stdout, stderr)
	case "inspect":
		err = runInspect(ctx, "inspect", args[1:], stdout, stderr)
	case "dead", "dead-letter":
		err = runDead(ctx, args[0], args[1:], stdout, stderr)
	case "tenants":
		err = runTenants(ctx, args[1:], stdout, stderr)
	case "pools":
		err = runPools(ctx, args[1:], stdout, stderr)
	case "batches":
		err = runBatches(ctx, args[1:], stdout, stderr)
	case "reuse":
		err = runReuse(ctx, args[1:], stdout, stderr)
	case "schedules":
		err = runSchedules(ctx, args[1:], stdout, stderr)
	case "plan":
		err = runPlan(ctx, args[1:], stdout, stderr)
	case "prune":
		err = runPrune(ctx, args[1:], stdout, stderr)
	case "console":
		err = runConsole(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, llmq.Version)
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errHelpUsage):
		fmt.Fprint(stderr, usage)
		return 0
	case errors.Is(err, errFlag):
		return 2
	case errors.Is(err, errUsage):
		// One line and a hint: the whole help buries what was wrong.
		fmt.Fprintf(stderr, "llmq: %v\n%s\n", err, usageHint)
		return 2
	case refusedInput(err):
		fmt.Fprintf(stderr, "llmq: %v\n", err)
		return 2
	default:
		if dbsql.StatementCacheLost(err) && !errors.Is(err, llmqtype.ErrStatementCache) {
			err = &llmqtype.StatementCacheError{Err: err} // say the fix: -database-url needs an exec mode
		}
		fmt.Fprintf(stderr, "llmq: %v\n", err)
		return 1
	}
}

// refusedInput reports whether err refuses what the command was given,
// rather than telling what the database said or did: exit 2, not 1.
func refusedInput(err error) bool {
	if _, ok := errors.AsType[*llmqtype.ValidationError](err); ok {
		return true // every llmq package's bad-input error is this type
	}
	for _, refused := range []error{errInvalidInput, llmq.ErrInvalidSchema, admission.ErrUnknownPool} {
		if errors.Is(err, refused) {
			return true
		}
	}
	return false
}

// checkTenant refuses a tenant name that llmq's stores would refuse, so that
// the command fails before it connects.
func checkTenant(what, tenant string) error {
	if problem := validate.Text(tenant, true, jobs.MaxTenantLen); problem != "" {
		return fmt.Errorf("%w: %s: the tenant %q %s", errInvalidInput, what, tenant, problem)
	}
	return nil
}

// checkPool refuses a pool name that the limiter would refuse.
func checkPool(what, pool string) error {
	if problem := validate.Text(pool, true, admission.MaxPoolLen); problem != "" {
		return fmt.Errorf("%w: %s: the pool %q %s", errInvalidInput, what, pool, problem)
	}
	return nil
}

// checkFlags refuses a -schema (every command's), or a -tenant or -pool
// (where a command has one and it is given), that llmq would refuse.
func checkFlags(fs *flag.FlagSet) error {
	if f := fs.Lookup("schema"); f != nil {
		if _, err := dbsql.NewSchema(f.Value.String()); err != nil {
			return fmt.Errorf("%s: -schema: %w", fs.Name(), err)
		}
	}
	if f := fs.Lookup("tenant"); f != nil && f.Value.String() != "" {
		if err := checkTenant(fs.Name()+": -tenant", f.Value.String()); err != nil {
			return err
		}
	}
	if f := fs.Lookup("pool"); f != nil && f.Value.String() != "" {
		return checkPool(fs.Name()+": -pool", f.Value.String())
	}
	return nil
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
	// The flag package calls Usage on -h and after every error it
	// reports; parseArgs prints the flags on -h only, and a hint otherwise.
	fs.Usage = func() {}
	c := &common{}
	fs.StringVar(&c.databaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL connection URL")
	fs.StringVar(&c.schema, "schema", envOr("LLMQ_SCHEMA", "llmq"), "Postgres schema holding the llmq tables")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	return fs, c
}

// parse parses args and refuses stray positional arguments.
func parse(fs *flag.FlagSet, args []string) error {
	_, err := parseArgs(fs, args, 0, "")
	return err
}

// parseArgs parses flags wherever they stand among args and returns the
// positional arguments, which must number exactly want (any number when
// want is negative); usage names them in the error otherwise. The flag package stops at the first positional
// argument, so parsing resumes after each one; everything after "--" is
// positional.
func parseArgs(fs *flag.FlagSet, args []string, want int, usage string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			printFlagUsage(fs, err)
			return nil, usageOrHelp(err)
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	if err := checkFlags(fs); err != nil {
		return nil, err
	}
	switch {
	case want < 0:
	case len(positional) > want:
		return nil, fmt.Errorf("%w: %s: unexpected argument %q", errUsage, fs.Name(), positional[want])
	case len(positional) < want:
		return nil, fmt.Errorf("%w: %s", errUsage, usage)
	}
	return positional, nil
}

// subcommand splits args into a command's subcommand and its arguments,
// naming the choices when there is none or an unknown one.
func subcommand(command string, args []string, choices ...string) (string, []string, error) {
	list := strings.Join(choices, " or ")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		return "", nil, errHelpUsage
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", nil, fmt.Errorf("%w: %s needs %s", errUsage, command, list)
	}
	if !slices.Contains(choices, args[0]) {
		return "", nil, fmt.Errorf("%w: %s %q: use %s", errUsage, command, args[0], list)
	}
	return args[0], args[1:], nil
}

// count is a flag holding a whole number that must not be negative; the
// flag package names the flag when Set refuses a value.
type count int64

func (c *count) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return errors.New("not a whole number")
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	*c = count(v)
	return nil
}

func (c *count) String() string { return strconv.FormatInt(int64(*c), 10) }

// setFlags returns the names of the flags given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// printFlagUsage follows a flag error, which the flag package has printed
// on its own line, with a hint; -h prints the command's flags.
func printFlagUsage(fs *flag.FlagSet, err error) {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(fs.Output(), "Usage of %s (flags may come before or after arguments):\n", fs.Name())
		fs.PrintDefaults()
		return
	}
	fmt.Fprintf(fs.Output(), "run '%s -h' for its flags\n", fs.Name())
}

// usageOrHelp passes -h through and marks other flag errors, which the
// flag package has reported, as such.
func usageOrHelp(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w: %w", errFlag, err)
}

func (c *common) connect(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("%w: -database-url: %w", errInvalidInput, err)
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
