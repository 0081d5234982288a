package lease

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dberr/dberrtest"
	"github.com/llmq/llmq/internal/dbtest"
)

// An outcome is recorded as unrecordable only when PostgreSQL refused the
// statement for what it holds, never for the connection's or the
// server's trouble, whose errors are real ones from the server: among
// them those a pooler in transaction mode gives pgx's statement cache
// (26000, 42P05), which a retry gets past.
func TestConnectionErrorsAreNotRefusals(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	for what, err := range dberrtest.ConnectionErrors(t, db.Schema) {
		require.False(t, refused(fmt.Errorf("jobs: complete: %w", err)), "%s: %v", what, err)
	}
	for what, err := range dberrtest.StatementErrors(t, db.Schema) {
		if what == "57014 statement_timeout" {
			require.False(t, refused(err), "a cancelled statement may pass on a retry")
			continue
		}
		require.True(t, refused(fmt.Errorf("jobs: complete: %w", err)), "%s: %v", what, err)
	}
}
