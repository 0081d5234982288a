package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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

// run runs the CLI in-process against the test's schema.
func (c *cli) run(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "-database-url", dbtest.URL(), "-schema", c.schema)
	code = run(c.t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

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
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "unknown migration version")
}

func TestStats(t *testing.T) {
	t.Parallel()
	c := setup(t)
	code, _, stderr := c.run("migrate", "up")
	require.Equal(t, 0, code, stderr)

	store, err := jobs.NewStore(jobs.Config{Schema: c.schema})
	require.NoError(t, err)
	pool := dbtest.Pool(t, 1)
	_, err = store.Enqueue(t.Context(), pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k"})
	require.NoError(t, err)

	code, out, _ := c.run("stats")
	require.Equal(t, 0, code)
	require.Contains(t, out, "READY")
	require.Contains(t, out, "default")

	code, out, _ = c.run("stats", "--json")
	require.Equal(t, 0, code)
	var stats []struct {
		Queue  string           `json:"queue"`
		Counts map[string]int64 `json:"counts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &stats))
	require.Equal(t, "default", stats[0].Queue)
	require.Equal(t, int64(1), stats[0].Counts["READY"])
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"frobnicate"}, {"migrate"}, {"migrate", "sideways"}, {"migrate", "up", "extra"}} {
		var out, errOut bytes.Buffer
		code := run(t.Context(), args, &out, &errOut)
		require.Equal(t, 2, code, strings.Join(args, " "))
		require.Contains(t, errOut.String(), "usage:")
	}
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"migrate", "up", "-schema", "public", "-database-url", dbtest.URL()}, &out, &errOut)
	require.Equal(t, 1, code)
	require.Contains(t, errOut.String(), "invalid schema name")
}
