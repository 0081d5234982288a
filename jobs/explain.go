package jobs

import (
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

// ErrNotMigrated is matched (errors.Is) when a store call found llmq's
// tables missing from its schema: the schema was never migrated, or the
// store was given another schema than the one migrated. The error is a
// *NotMigratedError naming the schema and the fix. It is
// llmqtype.ErrNotMigrated, which every llmq package returns alike.
var ErrNotMigrated = llmqtype.ErrNotMigrated

// NotMigratedError reports a missing llmq table together with what to do
// about it; it is llmqtype.NotMigratedError.
type NotMigratedError = llmqtype.NotMigratedError

// explain turns an undefined-table error into a *NotMigratedError for the
// store's schema, and a prepared statement lost behind a transaction pooler
// into a *llmqtype.StatementCacheError (see dbsql.Explain); any other error
// is returned as it is.
func (s *PostgresStore) explain(err error) error {
	return dbsql.Explain(err, s.cfg.Schema, "jobs.Config.Schema")
}
