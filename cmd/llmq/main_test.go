package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

type cli struct {
	t      *testing.T
	schema string
}

func setup(t *testing.T) *cli {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	return &cli{t: t, schema: db.Schema}
}

// runCLI runs the CLI in-process with exactly args.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// run runs a command against the test's schema, its flags after args.
func (c *cli) run(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	return runCLI(c.t, append(args, c.flags()...)...)
}

// runCommand runs command (its words, such as "dead-letter", "list") with
// the test's schema flags first, then args, for commands that end in
// positional arguments.
func (c *cli) runCommand(command []string, args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	return runCLI(c.t, append(append(command, c.flags()...), args...)...)
}

// migrated migrates the test's schema through the CLI and returns a job
// store on it, with a pool, to set up data for the commands to read.
func (c *cli) migrated() (*jobs.PostgresStore, *pgxpool.Pool) {
	c.t.Helper()
	code, _, stderr := c.run("migrate", "up")
	require.Equal(c.t, 0, code, stderr)
	store, err := jobs.NewStore(jobs.Config{Schema: c.schema})
	require.NoError(c.t, err)
	return store, dbtest.Pool(c.t, 1)
}

func (c *cli) flags() []string { return []string{"-database-url", dbtest.URL(), "-schema", c.schema} }

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	c := setup(t)

	code, out, _ := c.run("migrate", "status", "--json")
	require.Equal(t, 0, code)
	var status struct {
		Migrations []migrationRow `json:"migrations"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &status))
	require.Len(t, status.Migrations, llmq.LatestVersion())
	require.False(t, status.Migrations[0].Applied)

	code, out, stderr := c.run("migrate", "up")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "0001_init")

	code, out, _ = c.run("migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "applied")
	require.NotContains(t, out, "pending")

	code, _, stderr = c.run("migrate", "down")
	require.Equal(t, 2, code, "down without -to is a usage error")
	require.Contains(t, stderr, "-to")

	code, out, stderr = c.run("migrate", "down", "-to", "0", "--json")
	require.Equal(t, 0, code, stderr)
	var report migrateReport
	require.NoError(t, json.Unmarshal([]byte(out), &report))
	require.Equal(t, "down", report.Direction)
	require.Len(t, report.Migrations, llmq.LatestVersion())
}

func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	c := setup(t)

	code, out, _ := c.run("migrate", "sql")
	require.Equal(t, 0, code)
	require.Contains(t, out, "CREATE TABLE "+c.schema+".jobs")
	code, out, _ = c.run("migrate", "sql", "-down")
	require.Equal(t, 0, code)
	require.Contains(t, out, "DROP TABLE "+c.schema+".jobs")

	code, _, stderr := c.run("migrate", "sql", "-to", "99")
	require.Equal(t, 2, code, "an unknown version is refused input")
	require.Contains(t, stderr, "unknown migration version")
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"frobnicate"}, {"migrate"}, {"migrate", "sideways"}, {"migrate", "up", "extra"}} {
		code, _, stderr := runCLI(t, args...)
		require.Equal(t, 2, code, strings.Join(args, " "))
		require.Contains(t, stderr, usageHint)
	}
	for _, args := range [][]string{{"-batch-size", "10001"}, {"-batch-size", "10", "-tenants", "2"}, {"-batch-size", "10", "-mode", "e2e"}} {
		code, _, stderr := runCLI(t, append([]string{"bench", "-database-url", dbtest.URL()}, args...)...)
		require.Equal(t, 2, code, strings.Join(args, " "))
		require.Contains(t, stderr, "-batch-size")
	}
	code, _, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-delete-published")
	require.Equal(t, 2, code, "-delete-published with the drain mode")
	require.Contains(t, stderr, "-delete-published is for -mode relay")
	code, _, stderr = runCLI(t, "bench", "-database-url", dbtest.URL(), "-wal-detail", "-wal-records=false")
	require.Equal(t, 2, code, "-wal-detail without the records it breaks down")
	require.Contains(t, stderr, "-wal-detail needs the WAL records")
	code, _, stderr = runCLI(t, "migrate", "up", "-schema", "public", "-database-url", dbtest.URL())
	require.Equal(t, 2, code, "a refused schema name is refused input")
	require.Contains(t, stderr, "invalid schema name")

	// The usage text names every command and alias, and -h is not an error.
	code, _, stderr = runCLI(t, "-h")
	require.Equal(t, 0, code)
	for _, command := range []string{"migrate up", "migrate down", "migrate status", "migrate sql", "stats", "jobs inspect ID", "jobs list", "jobs cancel ID",
		"dead list", "dead replay ID --reason WHY [--by WHO]", "tenants list", "tenants set TENANT", "--weight W", "--max-in-flight N",
		"--max-pending-jobs N", "--max-daily-cost N", "tenants set --defaults", "tenants reset TENANT", "pools list", "pools set POOL", "--rpm R", "--tpm T",
		"--in-flight N", "bench", "plan", "inspect = jobs inspect", "dead-letter = dead"} {
		require.Contains(t, stderr, command)
	}
	code, _, stderr = runCLI(t, "pools", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "pools set POOL")
	code, _, stderr = runCLI(t, "tenants", "set", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "-max-pending-tokens tokens")
}

// llmq version prints the build's version, the root package's constant.
func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "version")
	require.Equal(t, 0, code)
	require.Equal(t, llmq.Version+"\n", out)
}

// The bench command runs each mode end to end on a small scale and prints
// its summary line; it leaves no schema behind. (Each run's own schema is
// checked: other tests create and drop bench schemas meanwhile.)
func TestBenchModes(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t, 1)
	schemaOf := regexp.MustCompile(`schema=(llmq_bench_[0-9a-f]+)`)
	for _, args := range [][]string{
		{"-mode", "drain", "-jobs", "300", "-workers", "20"},
		{"-mode", "drain", "-jobs", "300", "-workers", "20", "-batch-size", "100"},
		{"-mode", "e2e", "-jobs", "200", "-workers", "20", "-producers", "4"},
		{"-mode", "latency", "-jobs", "20", "-workers", "5", "-rate", "200"},
		{"-mode", "relay", "-jobs", "300", "-workers", "2"},
		{"-mode", "relay", "-jobs", "300", "-workers", "2", "-broker", "rabbitmq"},
		{"-mode", "ingress", "-jobs", "300", "-workers", "2"},
		{"-mode", "ingress", "-jobs", "300", "-workers", "2", "-broker", "rabbitmq"},
	} {
		code, out, stderr := runCLI(t, append([]string{"bench", "-database-url", dbtest.URL()}, args...)...)
		require.Equal(t, 0, code, stderr)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		require.Regexp(t, `^llmq (drain|e2e|latency|relay|ingress) jobs=\d+ workers=\d+ seconds=[0-9.]+ jobs_per_s=\d+$`, last)
		if args[1] == "latency" {
			require.Contains(t, out, "enqueue_to_start p50=")
		}
		if args[1] == "drain" || args[1] == "e2e" {
			require.Regexp(t, `(?m)^llmq cpu per job: client_us=[0-9.]+ server_us=[0-9.]+ client_allocs=[0-9.]+$`, out)
		}
		if args[1] == "relay" && slices.Contains(args, "rabbitmq") {
			require.Regexp(t, `raw_confirmed_per_s=\d+ relay_per_s=\d+ relay_to_raw=[0-9.]+ \(rounds [0-9. ]+\)`, out)
		}
		m := schemaOf.FindStringSubmatch(stderr)
		require.NotNil(t, m, stderr)
		var left bool
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, m[1]).Scan(&left))
		require.False(t, left, "the throwaway schema %s is dropped", m[1])
	}
}

// With -json the drain, e2e, latency, relay and ingress benches print one
// JSON object holding what the text lines hold; the soak, which prints
// only key=value lines, refuses -json rather than ignore it.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	type report struct {
		Mode          string  `json:"mode"`
		Jobs          int     `json:"jobs"`
		Seconds       float64 `json:"seconds"`
		JobsPerSecond float64 `json:"jobs_per_s"`
		WAL           []struct {
			Phase       string   `json:"phase"`
			Relation    string   `json:"relation"`
			BytesPerJob float64  `json:"bytes_per_job"`
			HeapInserts *float64 `json:"heap_inserts_per_job"`
		} `json:"wal"`
		Relay *struct {
			Fleet *struct {
				Relays          int     `json:"relays"`
				As              string  `json:"as"`
				Events          int     `json:"events"`
				EventsPerSecond float64 `json:"events_per_s"`
				PeakConnections *struct {
					AllRelays int `json:"all_relays"`
				} `json:"peak_connections"`
				CPU *struct {
					WindowSeconds float64 `json:"window_s"`
				} `json:"cpu"`
			} `json:"fleet"`
			RabbitMQ *struct {
				RelayToRaw float64   `json:"relay_to_raw"`
				Rounds     []float64 `json:"rounds_relay_to_raw"`
			} `json:"rabbitmq"`
		} `json:"relay"`
		CPU *struct {
			ClientUSPerJob float64  `json:"client_us_per_job"`
			ServerUSPerJob *float64 `json:"server_us_per_job"`
		} `json:"cpu"`
		Latency *struct {
			EnqueueToStart struct {
				N     int     `json:"n"`
				P50Ms float64 `json:"p50_ms"`
				MaxMs float64 `json:"max_ms"`
			} `json:"enqueue_to_start"`
		} `json:"latency"`
	}
	for _, args := range [][]string{
		{"-mode", "drain", "-jobs", "200", "-workers", "10", "-wal-detail"},
		{"-mode", "e2e", "-jobs", "100", "-workers", "10", "-producers", "2", "-wal-records=false"},
		{"-mode", "latency", "-jobs", "20", "-workers", "5", "-rate", "200"},
		{"-mode", "ingress", "-jobs", "100", "-workers", "2"},
		{"-mode", "relay", "-jobs", "300", "-workers", "2"},
		{"-mode", "relay", "-jobs", "300", "-workers", "2", "-broker", "rabbitmq"},
	} {
		code, out, stderr := runCLI(t, append([]string{"bench", "-database-url", dbtest.URL(), "-json"}, args...)...)
		require.Equal(t, 0, code, stderr)
		var r report
		require.NoError(t, json.Unmarshal([]byte(out), &r), "one JSON object: %s", out)
		require.Equal(t, args[1], r.Mode)
		require.Equal(t, args[3], strconv.Itoa(r.Jobs))
		require.Positive(t, r.Seconds)
		require.InDelta(t, float64(r.Jobs)/r.Seconds, r.JobsPerSecond, 0.01*r.JobsPerSecond)
		var phases, relations []string
		for _, w := range r.WAL {
			require.Positive(t, w.BytesPerJob, out)
			if w.Relation != "" {
				relations = append(relations, w.Relation)
				continue
			}
			phases = append(phases, w.Phase)
			if args[1] == "drain" && w.HeapInserts == nil {
				// The shared server recycled the phase's WAL (other tests
				// wrote plenty) before the bench read it back: the bench
				// says so and gives the total alone.
				require.Contains(t, stderr, "printing the total only", "records are read back when the WAL is still there: %s", out)
				continue
			}
			require.Equal(t, args[1] == "drain", w.HeapInserts != nil, "records are read back unless -wal-records=false: %s", out)
		}
		if args[1] == "drain" || args[1] == "e2e" {
			require.NotNil(t, r.CPU, out)
			require.Positive(t, r.CPU.ClientUSPerJob, "the runner used CPU: %s", out)
			require.NotNil(t, r.CPU.ServerUSPerJob, "PostgreSQL runs on this machine: %s", out)
			require.GreaterOrEqual(t, *r.CPU.ServerUSPerJob, 0.0)
		}
		switch args[1] {
		case "drain":
			require.Equal(t, []string{"insert", "vacuum", "drain", "run"}, phases)
			require.Contains(t, relations, "jobs")
		case "e2e":
			require.Equal(t, []string{"run"}, phases)
		case "latency":
			require.NotNil(t, r.Latency, out)
			require.Equal(t, 20, r.Latency.EnqueueToStart.N)
			require.Positive(t, r.Latency.EnqueueToStart.P50Ms)
			require.GreaterOrEqual(t, r.Latency.EnqueueToStart.MaxMs, r.Latency.EnqueueToStart.P50Ms)
		case "relay":
			require.NotNil(t, r.Relay, out)
			if slices.Contains(args, "rabbitmq") {
				require.NotNil(t, r.Relay.RabbitMQ, out)
				require.Nil(t, r.Relay.Fleet, "the fleet's runs go to stderr: %s", out)
				require.NotEmpty(t, r.Relay.RabbitMQ.Rounds)
				require.Positive(t, r.Relay.RabbitMQ.RelayToRaw)
				break
			}
			f := r.Relay.Fleet
			require.NotNil(t, f, out)
			require.Equal(t, 2, f.Relays)
			require.Equal(t, "processes", f.As)
			require.Equal(t, 300, f.Events)
			require.Positive(t, f.EventsPerSecond)
			require.NotNil(t, f.PeakConnections, out)
			require.Positive(t, f.PeakConnections.AllRelays)
			require.NotNil(t, f.CPU, out)
			require.Positive(t, f.CPU.WindowSeconds)
		default:
			require.Empty(t, r.WAL)
			require.Nil(t, r.Latency)
			require.Nil(t, r.Relay)
		}
	}
	code, _, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-json", "-mode", "soak")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "-json: -mode soak prints key=value lines only")
}
