package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
)

func TestPlan(t *testing.T) {
	t.Parallel()
	// The seed's numbers: 600 RPM, 120k TPM, 4,000 tokens a call, 15s
	// calls, 10,000 invoices.
	code, out, stderr := runCLI(t, "plan", "-rpm", "600", "-tpm", "120000", "-concurrency", "90",
		"-latency", "15s", "-tokens", "4000", "-backlog", "10000", "-arrivals-per-hour", "900", "--json")
	require.Equal(t, 0, code, stderr)
	var r planResult
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.InDelta(t, 10, r.RequestLimited, 1e-9)
	require.InDelta(t, 0.5, r.TokenLimited, 1e-9)
	require.InDelta(t, 6, r.ConcurrencyLimited, 1e-9)
	require.InDelta(t, 0.5, r.AttemptCapacity, 1e-9)
	require.Equal(t, "tokens (TPM)", r.Binding)
	require.InDelta(t, 20_000, r.DrainSeconds, 1e-6, "10,000 jobs at 0.5/s")
	require.InDelta(t, 40_000, r.DrainWithArrivals, 1e-6, "0.25/s of headroom left by 900 arrivals an hour")

	code, out, _ = runCLI(t, "plan", "-rpm", "60", "-tpm", "1000000", "-concurrency", "3",
		"-latency", "10s", "-attempts-per-job", "1.5", "-backlog", "100", "-arrivals-per-hour", "3600")
	require.Equal(t, 0, code)
	require.Contains(t, out, "bound by concurrency")
	require.Contains(t, out, "= 0.200 jobs/s")
	require.Contains(t, out, "never: arrivals reach capacity")

	for _, bad := range [][]string{
		{"plan"},
		{"plan", "-rpm", "600", "-tpm", "1", "-concurrency", "1", "-attempts-per-job", "0.5"},
		{"plan", "-rpm", "600", "-tpm", "1", "-concurrency", "1", "-latency", "0s"},
		{"plan", "-rpm", "600", "-tpm", "1", "-concurrency", "1", "-backlog", "-1"},
	} {
		code, _, _ := runCLI(t, bad...)
		require.Equal(t, 2, code, "%v", bad)
	}
}

// -pool takes the limits an operator configured, from the database.
func TestPlanFromPool(t *testing.T) {
	t.Parallel()
	c := setup(t)
	_, pool := c.migrated()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: c.schema})
	require.NoError(t, err)
	require.NoError(t, l.SetPool(t.Context(), admission.Pool{Name: "gpt", RPM: 600, TPM: 120_000, MaxInFlight: 20}))
	code, out, stderr := c.run("plan", "-pool", "gpt", "-tokens", "2000", "-latency", "4s", "--json")
	require.Equal(t, 0, code, stderr)
	var r planResult
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.InDelta(t, 1, r.TokenLimited, 1e-9)
	require.InDelta(t, 5, r.ConcurrencyLimited, 1e-9)
	require.InDelta(t, 1, r.AttemptCapacity, 1e-9)

	// Limits given explicitly win over the pool's: "this pool at twice its
	// TPM".
	code, out, stderr = c.run("plan", "-pool", "gpt", "-tpm", "240000", "-concurrency", "40", "-tokens", "2000", "-latency", "4s", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.InDelta(t, 2, r.TokenLimited, 1e-9)
	require.InDelta(t, 10, r.ConcurrencyLimited, 1e-9)
	require.InDelta(t, 10, r.RequestLimited, 1e-9, "-rpm not given: the pool's")

	code, _, stderr = c.run("plan", "-pool", "missing")
	require.Equal(t, 2, code, "an unknown pool is refused input")
	require.Contains(t, stderr, "unknown pool")
}
