package dbsql

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/llmqtype"
)

// undefinedTable is PostgreSQL's SQLSTATE for a relation that does not
// exist.
const undefinedTable = "42P01"

// Migrated turns an undefined-table error into a
// *llmqtype.NotMigratedError naming the schema and the setting that chose
// it (config, e.g. "outbox.Config.Schema"), so the first error a host sees
// on an unmigrated schema says the fix. Any other error, and nil, is
// returned as it is.
func Migrated(err error, schema, config string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		return &llmqtype.NotMigratedError{Schema: schema, Config: config, Err: err}
	}
	return err
}
