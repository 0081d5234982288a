package schedule

import (
	"testing"

	"github.com/llmq/llmq/internal/dbsql/dbsqltest"
)

// Every statement of the package's SQL file matches what the code binds
// and scans.
func TestStatements(t *testing.T) {
	t.Parallel()
	var q statements
	dbsqltest.Check(t, &q, q.load)
}
