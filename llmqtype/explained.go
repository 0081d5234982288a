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
// 42P01, undefined_table), or a missing column of one (42703: a schema
// behind the code's migrations), together with what to do about it.
type NotMigratedError struct {
	Schema string // the schema the component was configured with
	Config string // the setting that names it, e.g. "jobs.Config.Schema"
	Err    error  // the database's error
	// Behind is true when the tables are there but a column the code
	// reads is not (SQLSTATE 42703): the schema is migrated to an older
	// version than the code needs.
	Behind bool
}

func (e *NotMigratedError) Error() string {
	if e.Behind {
		return fmt.Sprintf("%v: schema %q is migrated to an older version than this code needs (%v); run llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: %q}) at start-up, or `llmq migrate up -schema %s`",
			ErrNotMigrated, e.Schema, e.Err, e.Schema, e.Schema)
	}
	return fmt.Sprintf("%v: schema %q has no llmq tables (%v); run llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: %q}) at start-up, or `llmq migrate up -schema %s`, or check that %s names the migrated schema",
		ErrNotMigrated, e.Schema, e.Err, e.Schema, e.Schema, e.Config)
}

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Unwrap returns the database's error.
func (e *NotMigratedError) Unwrap() error { return e.Err }

// ErrStatementCache is matched (errors.Is) when a pool's prepared
// statements did not survive from one transaction to the next: the pool
// reaches PostgreSQL through a transaction pooler that does not keep
// prepared statements (PgBouncer before 1.21, or without
// max_prepared_statements) while pgx caches them, its default query exec
// mode. The error is a *StatementCacheError saying the fix.
var ErrStatementCache = errors.New("llmq: pgx's prepared statements do not survive the connection pooler")

// StatementCacheError reports a prepared statement of pgx's statement
// cache that PostgreSQL no longer had or already had (SQLSTATE 26000 or
// 42P05), together with what to do about it.
type StatementCacheError struct {
	Err error // the database's error
}

func (e *StatementCacheError) Error() string {
	return fmt.Sprintf("%v (%v); a transaction pooler gave this transaction another server connection than the one pgx prepared the statement on: set default_query_exec_mode=exec (or cache_describe, or simple_protocol) on the pool's connection string, or keep prepared statements in the pooler (PgBouncer 1.21 or later with max_prepared_statements); see llmq's docs/operations.md, Connection poolers",
		ErrStatementCache, e.Err)
}

// Is makes errors.Is(err, ErrStatementCache) true.
func (e *StatementCacheError) Is(target error) bool { return target == ErrStatementCache }

// Unwrap returns the database's error.
func (e *StatementCacheError) Unwrap() error { return e.Err }
