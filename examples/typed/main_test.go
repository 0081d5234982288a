package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/llmqtest"
)

// The program runs end to end: the retried request finds the first job and
// leaves no second service row, the handler fails once and then succeeds.
func TestTypedProgram(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t)
	for run := 1; run <= 2; run++ { // a second run finds the schema migrated
		var out bytes.Buffer
		require.NoError(t, runProgram(t, db, &out))
		require.Equal(t, `retry existing=true, SUCCEEDED "total 1234.50"
attempt 1: retry_scheduled provider: 503
attempt 2: succeeded 
`, out.String())
		var rows int
		require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+db.Schema+".invoices").Scan(&rows))
		require.Equal(t, run, rows, "one service row per accepted request, none for its retry")
	}
}

func runProgram(t *testing.T, db *llmqtest.DB, out *bytes.Buffer) error {
	t.Helper()
	return run(t.Context(), llmqtest.URL(), db.Schema, out)
}

// The program stays short enough to read in the README: within 100 lines,
// handling each error where it occurs.
func TestTypedProgramLength(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	require.LessOrEqual(t, bytes.Count(src, []byte("\n")), 100)
}
