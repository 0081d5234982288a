// Package dbsql is how llmq talks SQL: the DBTX seam every store method
// accepts, validated schema names, and the named-query files each package
// keeps its SQL in.
//
// Every llmq table lives in one Postgres schema chosen by the host (default
// "llmq"). SQL files refer to tables as /*schema*/name; the marker is a
// comment, so the files stay valid SQL for editors and linters, and Render
// turns it into a schema-qualified name once, when a store is built. Because
// schema names are validated against a strict pattern before they are ever
// rendered, no identifier quoting is needed and no user input reaches SQL
// text.
//
// # Checked statements
//
// Statements are bound and scanned by position, so a statement and the Go
// code that runs it must agree on its parameters and on its result columns.
// llmq checks that agreement in a test, against a migrated schema, rather
// than generating code: the .sql files stay the source of the SQL, with
// their lock and index reasoning, their fragments, blocks and schema marker,
// and the Go code stays the source of what is bound and scanned.
//
// One way to hold statements. Each package declares one unexported struct
// of strings, one field per named statement of all its .sql files, and a
// load method that passes one Spec per statement to Load:
//
//	type statements struct{ insertEvent, claimEvents string }
//
//	func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
//		return dbsql.Load(schema, []string{queriesSQL, pruneSQL},
//			dbsql.Query(&q.insertEvent, "InsertEvent", 8, new(int64), new(time.Time)),
//			dbsql.Query(&q.claimEvents, "ClaimEvents", 6, new(claimedRow).dest()...),
//		)
//	}
//
// Every constructor of the package calls load once, stores the struct, and
// runs its fields; nothing looks a statement up by name afterwards. Load
// fails construction when a spec names a statement the files lack, when two
// specs name one statement, and when the files hold a statement no spec
// declares.
//
// A Spec says how many arguments the code binds, and how it runs the
// statement: Exec (no rows), Discard (run with Exec although it returns a
// row, like a SELECT of set_config), Script (several statements without
// arguments, such as an example's table DDL) or Query with the scan
// destinations. The destinations must come from the code that scans: a row
// of more than a few columns is scanned through a dest method or function
// (row.Scan(r.dest()...)) and the spec passes that same function's result
// for a zero row, so a column added to the statement but not to the
// function, or to the function but not to the statement, fails the check.
// A scan of one to four plain values may declare its destinations inline
// (new(int64), new(*time.Time)); the check still catches a column added to
// the statement.
//
// The check is package dbsqltest: one test per package, Check(t, &q,
// q.load), prepares every statement on a freshly migrated schema (after
// running its scripts) and compares Postgres' description with the specs:
// the parameter count; the argument types, where a spec declares them with
// Binds (pgx must be able to encode each example for its parameter's type;
// like inline destinations, such a declaration sits beside the call that
// binds, not in it); that an Exec statement returns no columns; and that a
// Query statement returns as many columns as it has destinations, each
// scannable by pgx into its destination's Go type. It also fails on a field
// of the struct that no spec filled. It cannot know nullability: a NULL
// scanned into a non-pointer still fails at run time only.
//
// Every llmq package and the llmq command hold their statements this way.
// The examples (invoice, erp, chaos) import no internal package, so that
// they can be copied into a service: they load their SQL with
// examples/internal/sqlfile and are not checked this way.
package dbsql
