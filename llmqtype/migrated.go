package llmqtype

import (
	"errors"
	"fmt"
)

// ErrNotMigrated is matched (errors.Is) when a call found llmq's tables
// missing from its schema: the schema was never migrated, or the component
// was given another schema than the one migrated. jobs.ErrNotMigrated is
// this error.
var ErrNotMigrated = errors.New("llmq: schema not migrated")

// NotMigratedError reports a missing llmq table (PostgreSQL's SQLSTATE
// 42P01, undefined_table) together with what to do about it.
type NotMigratedError struct {
	Schema string // the schema the component was configured with
	Config string // the setting that names it, e.g. "jobs.Config.Schema"
	Err    error  // the database's error
}

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("%v: schema %q has no llmq tables (%v); run llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: %q}) at start-up, or `llmq migrate up -schema %s`, or check that %s names the migrated schema",
		ErrNotMigrated, e.Schema, e.Err, e.Schema, e.Schema, e.Config)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Unwrap returns the database's error.
func (e *NotMigratedError) Unwrap() error { return e.Err }
