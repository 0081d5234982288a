package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
)

// A small run of the whole mode, two processes enqueueing and running
// for two tenants: with reuse keys, every job succeeds with its own
// tenant's answer, each answer is paid for once and once more per
// injected failure, every other job reuses, and the claims probe
// jobs_reuse_idx; without keys, every job pays and nothing probes the
// index.
func TestBenchReuse(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-mode", "reuse", "-json",
		"-jobs", "300", "-keys", "30", "-tenants", "2", "-producers", "2", "-workers", "8", "-fail-rate", "0.1", "-hold", "2ms")
	require.Equal(t, 0, code, stderr)
	// A walLine's record figures are an unexported embedded pointer, which
	// encoding/json writes but cannot fill: the lines are read as maps.
	var r struct {
		Jobs   int `json:"jobs"`
		Phases []struct {
			reusePhase
			WAL []map[string]any `json:"wal"`
		} `json:"phases"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Equal(t, 300, r.Jobs)
	require.Len(t, r.Phases, 2)
	for _, p := range r.Phases {
		require.Equal(t, 300, p.Succeeded, "reuse=%t", p.Reuse)
		require.Zero(t, p.WrongResults, "reuse=%t: every result is the job's own answer", p.Reuse)
		require.Zero(t, p.Unrecorded, "reuse=%t", p.Reuse)
		require.Positive(t, p.ClaimStatements, "reuse=%t: the claims are recognised by their text", p.Reuse)
		require.Positive(t, p.JobsPerSecond, "reuse=%t", p.Reuse)
		// 300 draws of 60 answers (each tenant's 30 keys are its own)
		// leave hardly any undrawn.
		require.LessOrEqual(t, p.Answers, 60)
		require.Greater(t, p.Answers, 30)
		require.Len(t, p.WAL, 1, "reuse=%t: the run's line", p.Reuse)
		require.Positive(t, p.WAL[0]["bytes_per_job"], "reuse=%t", p.Reuse)
	}
	with, without := r.Phases[0].reusePhase, r.Phases[1].reusePhase
	require.True(t, with.Reuse)
	require.False(t, without.Reuse)

	require.LessOrEqual(t, with.PaidCalls, with.MostPaidCalls)
	require.Equal(t, with.Answers+with.InjectedFailures, with.MostPaidCalls)
	require.Equal(t, 300, with.ReusedJobs+with.PaidCalls-with.InjectedFailures,
		"every job either reused a result or computed its own, once")
	require.Equal(t, with.Attempts, with.PaidCalls+with.ReusedJobs, "an attempt either called its handler or reused")
	require.Positive(t, with.IndexProbes)
	require.InDelta(t, float64(with.IndexProbes)/float64(with.Attempts), with.ProbesPerAttempt, 1e-9)

	require.Zero(t, without.ReusedJobs)
	require.Equal(t, 300+without.InjectedFailures, without.PaidCalls, "without keys, every attempt pays")
	require.Positive(t, without.InjectedFailures, "a tenth of some 330 calls fail")
	require.Zero(t, without.IndexProbes, "a job without a key probes nothing")
}

// Bad flags are refused before anything connects, naming the flag.
func TestBenchReuseRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"-keys", "0"}, "-keys"},
		{[]string{"-fail-rate", "0.6"}, "-fail-rate 0.6"},
		{[]string{"-fail-rate", "NaN"}, "-fail-rate NaN"},
		{[]string{"-producers", "4", "-workers", "3"}, "at least one of each per process"},
		{[]string{"-producers", "17"}, "-producers 17"},
		{[]string{"-hold", "-1ms"}, "-hold -1ms"},
		{[]string{"-wal-detail", "-wal-records=false"}, "-wal-detail"},
	} {
		code, out, stderr := runCLI(t, append([]string{"bench", "-database-url", "postgres://nobody@127.0.0.1:1/none", "-mode", "reuse"}, c.args...)...)
		require.Equal(t, 2, code, "%v: %s", c.args, stderr)
		require.Empty(t, out)
		require.Contains(t, stderr, c.says, c.args)
	}
}
