package llmqtest

import "github.com/llmq/llmq/internal/dbsql"

// statements is every statement of queries.sql, with the shape the code
// binds and scans; TestStatements checks it against a migrated schema.
type statements struct {
	createCapture, capture, clear, ready string // the schema pool (db.go)
	idle, unservedKinds                  string // WorkUntilIdle (work.go)
}

// load renders the statements for schema. CreateCapture is run once,
// with Exec and no arguments, in the transaction that captures the seed.
func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Exec(&q.createCapture, "CreateCapture", 0),
		dbsql.Discard(&q.capture, "Capture", 1),
		dbsql.Discard(&q.clear, "Clear", 0),
		dbsql.Query(&q.ready, "Ready", 1, new(bool)),
		dbsql.Query(&q.idle, "Idle", 3, new(bool)),
		dbsql.Query(&q.unservedKinds, "UnservedKinds", 2, new(string)),
	)
}
