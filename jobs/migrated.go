package jobs

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotMigrated is matched (errors.Is) when a store call found llmq's
// tables missing from its schema: the schema was never migrated, or the
// store was given another schema than the one migrated. The error is a
// *NotMigratedError naming the schema and the fix.
var ErrNotMigrated = errors.New("jobs: schema not migrated")

// NotMigratedError reports a missing llmq table (PostgreSQL's SQLSTATE
// 42P01, undefined_table) together with what to do about it.
type NotMigratedError struct {
	Schema string
	Err    error // the database's error
}

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("%v: schema %q has no llmq tables (%v); run llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: %q}) at start-up, or `llmq migrate up -schema %s`, or check that jobs.Config.Schema names the migrated schema",
		ErrNotMigrated, e.Schema, e.Err, e.Schema, e.Schema)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Unwrap returns the database's error.
func (e *NotMigratedError) Unwrap() error { return e.Err }

// undefinedTable is PostgreSQL's SQLSTATE for a relation that does not
// exist.
const undefinedTable = "42P01"

// migrated turns an undefined-table error into a *NotMigratedError for the
// store's schema, and returns any other error as it is.
func (s *PostgresStore) migrated(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		return &NotMigratedError{Schema: s.cfg.Schema, Err: err}
	}
	return err
}
