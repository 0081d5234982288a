package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/llmqtest"
)

// The quickstart runs end to end, twice on the same schema (the second run
// finds the job's key free again, since it is new for each run, and the
// schema migrated).
func TestQuickstartRuns(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t)
	require.NoError(t, run(t.Context(), llmqtest.URL(), db.Schema))
	require.NoError(t, run(t.Context(), llmqtest.URL(), db.Schema))
}
