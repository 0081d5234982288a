package erp

import (
	"testing"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbsql/dbsqltest"
)

// Every statement of the package's SQL files matches what the code binds
// and scans.
func TestStatements(t *testing.T) {
	t.Parallel()
	dbsqltest.Check(t, func(s dbsql.Schema) (dbsql.Set, error) {
		var q statements
		return q.load(s)
	})
}
