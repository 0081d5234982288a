package main

import (
	"testing"

	"github.com/llmq/llmq/internal/dbsql/dbsqltest"
)

// The bench's own statements match what its code binds and scans.
func TestStatements(t *testing.T) {
	t.Parallel()
	var q historyStatements
	dbsqltest.Check(t, &q, q.load)
}
