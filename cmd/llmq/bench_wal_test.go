package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
)

// The drain bench prints the WAL written per job by each phase and by the
// whole run, e2e by the whole run; with pg_walinspect each line also gives
// the schema's own share, which is part of the total, and -wal-detail
// breaks it down by relation.
func TestBenchWAL(t *testing.T) {
	t.Parallel()
	line := regexp.MustCompile(`(?m)^llmq wal phase=(\w+) jobs=(\d+) bytes_per_job=(\d+) schema_bytes_per_job=(\d+) records_per_job=[0-9.]+ ` +
		`fpi_bytes_per_job=\d+ heap_inserts_per_job=([0-9.]+) updates_per_job=[0-9.]+ hot_pct=\d+ locks_per_job=[0-9.]+ ` +
		`deletes_per_job=[0-9.]+ index_entries_per_job=[0-9.]+$`)
	for _, c := range []struct {
		args   []string
		phases []string
	}{
		{[]string{"-mode", "drain", "-jobs", "200", "-workers", "10", "-wal-detail"}, []string{"insert", "vacuum", "drain", "run"}},
		{[]string{"-mode", "e2e", "-jobs", "100", "-workers", "10", "-producers", "2"}, []string{"run"}},
	} {
		code, out, stderr := runCLI(t, append([]string{"bench", "-database-url", dbtest.URL()}, c.args...)...)
		require.Equal(t, 0, code, stderr)
		var phases []string
		for _, m := range line.FindAllStringSubmatch(out, -1) {
			phases = append(phases, m[1])
			total, _ := strconv.Atoi(m[3])
			own, _ := strconv.Atoi(m[4])
			require.LessOrEqual(t, own, total, m[0])
			if m[1] == "insert" || m[1] == "run" {
				// A job row and its keys at least, and its requested
				// event's row or share of a batch row (an enqueue of many
				// jobs writes their events as one).
				inserts, _ := strconv.ParseFloat(m[5], 64)
				require.Greater(t, inserts, 2.0, m[0])
			}
		}
		require.Equal(t, c.phases, phases, out)
		if c.args[1] == "drain" {
			require.Regexp(t, `(?m)^llmq wal phase=drain relation=jobs jobs=\d+ bytes_per_job=\d+ `, out)
		}
	}

	// -wal-records=false leaves the records unread: every phase still has
	// its total, and nothing more.
	code, out, stderr := runCLI(t, "bench", "-database-url", dbtest.URL(), "-mode", "drain", "-jobs", "100", "-workers", "10", "-wal-records=false")
	require.Equal(t, 0, code, stderr)
	totals := regexp.MustCompile(`(?m)^llmq wal phase=(\w+) jobs=100 bytes_per_job=[1-9]\d*$`).FindAllStringSubmatch(out, -1)
	require.Len(t, totals, 4, out)
	require.NotContains(t, out, "schema_bytes_per_job")
}
