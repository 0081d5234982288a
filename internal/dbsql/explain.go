package dbsql

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/llmqtype"
)

// SQLSTATEs Explain recognises.
const (
	undefinedTable             = "42P01"
	undefinedColumn            = "42703"
	invalidSQLStatementName    = "26000" // a prepared statement that does not exist
	duplicatePreparedStatement = "42P05"
)

// Explain turns the database errors a host meets first when llmq is set
// up wrongly into errors that say the fix, and returns any other error,
// and nil, as it is:
//
//   - an undefined table becomes a *llmqtype.NotMigratedError naming the
//     schema and the setting that chose it (config, e.g.
//     "outbox.Config.Schema"), and so does an undefined column: llmq's
//     statements are checked against the migrated schema, so a column
//     they cannot find is one a later migration adds (the code was
//     upgraded, the schema not yet);
//   - a prepared statement of pgx's statement cache that the server lost or
//     already had becomes a *llmqtype.StatementCacheError: the pool goes
//     through a transaction pooler that does not keep prepared statements.
func Explain(err error, schema, config string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == undefinedTable:
		return &llmqtype.NotMigratedError{Schema: schema, Config: config, Err: err}
	case pgErr.Code == undefinedColumn:
		return &llmqtype.NotMigratedError{Schema: schema, Config: config, Err: err, Behind: true}
	case StatementCacheLost(err):
		return &llmqtype.StatementCacheError{Err: err}
	}
	return err
}

// StatementCacheLost reports whether err is PostgreSQL refusing a prepared
// statement of pgx's statement cache (named stmtcache_…) as missing or as
// already there: what the cache meets when a transaction pooler hands the
// connection's transactions to different server connections. The
// statement itself is sound; it fails for the connection it met.
func StatementCacheLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) &&
		(pgErr.Code == invalidSQLStatementName || pgErr.Code == duplicatePreparedStatement) &&
		strings.Contains(pgErr.Message, "stmtcache_")
}
