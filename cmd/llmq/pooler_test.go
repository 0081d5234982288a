package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/pgbouncertest"
)

// The operator's commands work through PgBouncer in transaction pooling
// mode in each pgx exec mode it leaves a host (see docs/operations.md,
// Connection poolers), -database-url naming the mode: the schema is
// migrated and read, a dead letter is listed, inspected and replayed, and
// a pool is set and listed.
func TestCommandsBehindPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t)
	for _, mode := range []string{"exec", "simple_protocol", "cache_describe"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := setupMigrated(t)
			run := func(args ...string) string {
				t.Helper()
				code, out, stderr := runCLI(t, append(args, "-database-url", bouncer.URL(mode), "-schema", f.schema)...)
				require.Equal(t, 0, code, "%v: %s", args, stderr)
				return out
			}
			run("migrate", "up")
			var status struct {
				Migrations []migrationRow `json:"migrations"`
			}
			require.NoError(t, json.Unmarshal([]byte(run("migrate", "status", "--json")), &status))
			require.Len(t, status.Migrations, llmq.LatestVersion())
			for _, m := range status.Migrations {
				require.True(t, m.Applied, m.Name)
			}

			dead := f.deadJob("acme", "extract")
			require.Contains(t, run("stats"), "default")
			require.Contains(t, run("jobs", "list", "-tenant", "acme"), dead.String())
			require.Contains(t, run("dead", "list"), dead.String())
			require.Contains(t, run("inspect", dead.String()), "400: bad document")
			require.Contains(t, run("dead", "replay", dead.String(), "--reason", "retry behind the pooler", "--by", "ops"), "replayed "+dead.String())
			run("tenants", "set", "acme", "--weight", "3")
			require.Regexp(t, `acme\s+3\s`, run("tenants", "list"))
			run("pools", "set", "gpt-4o", "--create", "--rpm", "600", "--tpm", "100000", "--in-flight", "10")
			require.Contains(t, run("pools", "list"), "gpt-4o")
		})
	}
}

// In pgx's default mode, which PgBouncer before 1.21 cannot carry, a
// command that meets another client's prepared statement on the server
// connection (the pooler has one, which the first command left it on)
// fails saying which -database-url works.
func TestCommandsInTheDefaultModeBehindAnOldPoolerSayTheFix(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgbouncertest.Options{PoolSize: 1})
	c := setup(t)
	args := []string{"migrate", "status", "-database-url", bouncer.URL(""), "-schema", c.schema}
	code, _, stderr := runCLI(t, args...)
	require.Equal(t, 0, code, stderr)
	code, _, stderr = runCLI(t, args...)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "SQLSTATE 42P05")
	require.Contains(t, stderr, "default_query_exec_mode=exec")
}
