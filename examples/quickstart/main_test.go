package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
)

// The quickstart runs end to end, twice on the same schema (a second run
// finds it migrated already).
func TestQuickstartRuns(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	require.NoError(t, run(t.Context(), dbtest.URL(), db.Schema))
	require.NoError(t, run(t.Context(), dbtest.URL(), db.Schema))
}
