package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
)

// The providerbatch mode serves its jobs through one provider batch of
// either API on the fake provider, every job SUCCEEDED, and reports each
// phase's time, WAL and round trips; its schema is dropped afterwards.
func TestBenchProviderBatch(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"openai", "anthropic"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			code, out, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-mode", "providerbatch", "-provider", provider,
				"-jobs", "300", "-batch-delay", "200ms", "-json")
			require.Equal(t, 0, code, stderr)
			var r struct {
				Mode               string  `json:"mode"`
				Provider           string  `json:"provider"`
				Jobs               int     `json:"jobs"`
				LoadAverage        float64 `json:"load_avg_1m"`
				Batches            int     `json:"batches"`
				FewestBatches      int     `json:"fewest_batches"`
				SubmitSeconds      float64 `json:"submit_s"`
				CreateSeconds      float64 `json:"create_calls_s"`
				ApplySeconds       float64 `json:"apply_s"`
				ApplyJobsPerSecond float64 `json:"apply_jobs_per_s"`
				NotSucceeded       *int    `json:"not_succeeded"`
				WAL                []struct {
					Phase       string  `json:"phase"`
					BytesPerJob float64 `json:"bytes_per_job"`
				} `json:"wal"`
				RoundTrips []struct {
					Phase            string  `json:"phase"`
					RoundTripsPerJob float64 `json:"round_trips_per_job"`
				} `json:"round_trips"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &r), "one JSON object: %s", out)
			require.Equal(t, "providerbatch", r.Mode)
			require.Equal(t, provider, r.Provider)
			require.Equal(t, 300, r.Jobs)
			require.NotNil(t, r.NotSucceeded, out)
			require.Zero(t, *r.NotSucceeded, "every job SUCCEEDED")
			require.Equal(t, 1, r.Batches, "300 jobs of one model: one provider batch")
			require.Equal(t, 1, r.FewestBatches)
			require.Positive(t, r.SubmitSeconds)
			require.Less(t, r.CreateSeconds, r.SubmitSeconds, "the create calls are part of the submit phase")
			require.Positive(t, r.ApplySeconds)
			require.Positive(t, r.ApplyJobsPerSecond)
			require.InDelta(t, 300/r.ApplySeconds, r.ApplyJobsPerSecond, 0.01*r.ApplyJobsPerSecond)
			var phases []string
			for _, w := range r.WAL {
				phases = append(phases, w.Phase)
				require.Positive(t, w.BytesPerJob, out)
			}
			require.Equal(t, []string{"enqueue", "submit", "apply", "run"}, phases)
			phases = nil
			for _, rt := range r.RoundTrips {
				phases = append(phases, rt.Phase)
				require.Positive(t, rt.RoundTripsPerJob, out)
			}
			require.Equal(t, []string{"enqueue", "submit", "apply", "run"}, phases)

			schema := regexp.MustCompile(`schema=(\S+)`).FindStringSubmatch(stderr)
			require.NotNil(t, schema, stderr)
			var left bool
			pool := dbtest.Pool(t, 1)
			require.NoError(t, pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema[1]).Scan(&left))
			require.False(t, left, "the throwaway schema %s is dropped", schema[1])
		})
	}
}

// Flags the mode cannot honour exit 2, naming the flag, before anything
// connects.
func TestBenchProviderBatchRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for flag, args := range map[string][]string{
		"-provider":    {"-provider", "gemini"},
		"-jobs":        {"-jobs", "50001"},
		"-batch-delay": {"-batch-delay", "0s"},
		"-wal-detail":  {"-wal-detail", "-wal-records=false"},
	} {
		code, out, stderr := runCLI(t, append([]string{"bench", "-database-url", "postgres://nobody@127.0.0.1:1/none", "-mode", "providerbatch"}, args...)...)
		require.Equal(t, 2, code, "%s: %s", flag, stderr)
		require.Empty(t, out)
		require.Contains(t, stderr, flag, stderr)
	}
}

// The text report is a table for people, the WAL lines, and one summary
// line last.
func TestBenchProviderBatchText(t *testing.T) {
	t.Parallel()
	r := &providerBatchReport{Mode: "providerbatch", Provider: "openai", Jobs: 10_000, LoadAverage: 0.5, BatchDelaySeconds: 1,
		Batches: 1, FewestBatches: 1, MaxRequestsPerBatch: 50_000, SubmitSeconds: 0.7, CreateSeconds: 0.1,
		ApplySeconds: 1.25, ApplyJobsPerSecond: 8000, WAL: []walLine{{Phase: "apply", Jobs: 10_000, BytesPerJob: 1900}},
		RoundTrips: []tripsLine{{Phase: "apply", RoundTripsPerJob: 0.02, StatementsPerJob: 0.025}}}
	var out bytes.Buffer
	require.NoError(t, r.print(false, &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Regexp(t, `^provider batches created +1 \(fewest possible 1, at 50000 requests a batch\)$`, lines[3])
	require.Contains(t, out.String(), "\napply rate                           8000 jobs/s\n")
	require.Contains(t, out.String(), "\nllmq wal phase=apply jobs=10000 bytes_per_job=1900\n")
	require.Equal(t, "llmq providerbatch provider=openai jobs=10000 batches=1 fewest_batches=1 submit_s=0.700 apply_s=1.250 apply_jobs_per_s=8000 not_succeeded=0",
		lines[len(lines)-1])
}
