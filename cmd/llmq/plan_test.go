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

// A local pool's plan: the admissible concurrency from the KV budget and
// the mean reservation, and the drain time from the prefill and decode
// times of the server's model.
func TestPlanLocal(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, "plan", "-kv-tokens", "200000", "-contexts", "3000:0.5,37000:0.5", "-max-tokens", "1000",
		"-output-tokens", "500", "-prefill-per-token", "100us", "-decode-step", "20ms", "-backlog", "100", "--json")
	require.Equal(t, 0, code, stderr)
	var r localPlanResult
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.InDelta(t, 21_000, r.MeanReservation, 1e-9, "a mean prompt of 20,000 plus 1,000 reserved for output")
	require.InDelta(t, 9, r.Concurrency, 1e-9, "200,000 / 21,000, rounded down")
	require.InDelta(t, 2, r.PrefillSecondsPerCall, 1e-9, "20,000 tokens at 100µs")
	require.InDelta(t, 500*0.02/9, r.DecodeSecondsPerCall, 1e-9)
	require.Equal(t, "prefill (the engine's prompt rate)", r.Binding)
	require.InDelta(t, 100*(2+500*0.02/9), r.DrainSeconds, 1e-6)
	require.True(t, r.LargestFits)

	code, out, _ = runCLI(t, "plan", "-kv-tokens", "50000", "-contexts", "60000:1")
	require.Equal(t, 0, code)
	require.Contains(t, out, "never admissible")

	for _, bad := range [][]string{
		{"plan", "-kv-tokens", "0"},
		{"plan", "-kv-tokens", "1000", "-contexts", "100:0.5"},
		{"plan", "-kv-tokens", "1000", "-contexts", "abc"},
		{"plan", "-kv-tokens", "1000", "-output-tokens", "2000"},
	} {
		code, _, _ := runCLI(t, bad...)
		require.Equal(t, 2, code, "%v", bad)
	}
}

// FuzzParseContexts: -contexts is parsed or refused, never a panic; what
// is parsed has positive tokens and fractions summing to 1.
func FuzzParseContexts(f *testing.F) {
	for _, seed := range []string{"2500:0.8,60000:0.2", "1:1", "", ":", "1e400:1", "5:0.5,5:0.5", "NaN:1", "3:-1,3:2"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		shares, err := parseContexts(s)
		if err != nil {
			return
		}
		sum := 0.0
		for _, c := range shares {
			require.GreaterOrEqual(t, c.Tokens, 1.0)
			require.Greater(t, c.Fraction, 0.0)
			sum += c.Fraction
		}
		require.InDelta(t, 1, sum, 0.001)
	})
}
