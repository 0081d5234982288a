package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
)

// Every refused input exits 2 with a message naming it, and writes nothing:
// how the command was called, a schema or tenant or pool name llmq refuses
// (refused before connecting), a value llmq's packages refuse, a migration
// version this build does not know, an unknown pool. Exit 1 is left for what
// the database said.
func TestRefusedInputExitsTwo(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	l, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)
	require.NoError(t, l.SetPool(t.Context(), admission.Pool{Name: "gpt", RPM: 600, TPM: 120_000, MaxInFlight: 20}))
	id := f.deadJob("acme", "transcribe").String()
	long := strings.Repeat("x", 201)

	for _, bad := range []struct {
		args     []string
		mentions []string
	}{
		{[]string{"tenants", "set", long, "--weight", "2"}, []string{"tenants set", "more than the limit of 200"}},
		{[]string{"tenants", "set", "bad\tname", "--max-pending-jobs", "2"}, []string{`"bad\tname"`, "control character"}},
		{[]string{"tenants", "set", "bad\xffname", "--weight", "2"}, []string{"not valid UTF-8"}},
		{[]string{"tenants", "reset", "nul\x00name"}, []string{"tenants reset", "control character"}},
		{[]string{"dead", "list", "-tenant", "bad\x01"}, []string{"-tenant", "control character"}},
		{[]string{"jobs", "inspect", id, "-tenant", long}, []string{"-tenant", "more than the limit of 200"}},
		{[]string{"pools", "set", "gpt-5", "--rpm", "100"}, []string{`unknown pool "gpt-5"`, "--create"}},
		{[]string{"pools", "set", "bad\tpool", "--create", "--rpm", "1", "--tpm", "1", "--in-flight", "1"}, []string{"pool", "control character"}},
		{[]string{"plan", "-pool", "missing"}, []string{"unknown pool"}},
		{[]string{"plan", "-pool", "nul\x00"}, []string{"-pool", "control character"}},
		{[]string{"migrate", "sql", "-to", "99"}, []string{"unknown migration version"}},
		{[]string{"migrate", "up", "-to", "99"}, []string{"-to 99", "unknown migration version"}},
		{[]string{"migrate", "down", "-to", "99"}, []string{"-to 99", "unknown migration version"}},
		{[]string{"migrate", "sql", "-from", "99"}, []string{"-from 99", "unknown migration version"}},
	} {
		f.refused(2, bad.args, bad.mentions...)
	}

	// A schema name llmq refuses, on every kind of command, before it
	// connects (the URL leads nowhere) and before anything is created.
	for _, schema := range []string{"public", "pg_llmq", "Bad-Name", "1st", strings.Repeat("s", 49), "llmq;drop"} {
		for _, command := range [][]string{{"migrate", "up"}, {"stats"}, {"tenants", "list"}, {"dead", "list"}, {"pools", "list"}, {"jobs", "inspect", id}} {
			args := append(append([]string(nil), command...), "-schema", schema, "-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
			code, stdout, stderr := runCLI(t, args...)
			require.Equal(t, 2, code, "%v: %s", args, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, "invalid schema name", "%v", args)
		}
	}
	var created bool
	require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT to_regclass('public.jobs') IS NOT NULL`).Scan(&created))
	require.False(t, created, "nothing was created in public")

	// A malformed database URL is refused input too; an unreachable
	// database is not.
	code, _, stderr := runCLI(t, "stats", "-database-url", "postgres://%zz")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "-database-url")
	code, _, stderr = runCLI(t, "stats", "-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.Equal(t, 1, code, stderr)

	// What the database says stays 1: a job that does not exist.
	code, _, stderr = f.run("jobs", "inspect", "0193a1c4-6e2f-7c4e-9b1a-2d3e4f5a6b7c")
	require.Equal(t, 1, code, stderr)
}
