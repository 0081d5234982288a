package invoice

import "github.com/llmq/llmq/internal/dbsql"

// statements is every statement of queries.sql, with the shape the code
// binds and scans; dbsqltest checks it against the schema.
type statements struct {
	createTables, putDocument, getDocument, putSupplier, getSupplier string
	snapshotSettled, currentSnapshot, maxEventSeq, eventsAfter       string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Script(&q.createTables, "CreateTables"),
		dbsql.Query(&q.putDocument, "PutDocument", 4, new(int)),
		dbsql.Query(&q.getDocument, "GetDocument", 3, new(string), new(string)),
		dbsql.Exec(&q.putSupplier, "PutSupplier", 3),
		dbsql.Query(&q.getSupplier, "GetSupplier", 2, new(string)),
		dbsql.Query(&q.snapshotSettled, "SnapshotSettled", 1, new(bool)),
		dbsql.Query(&q.currentSnapshot, "CurrentSnapshot", 0, new(string)),
		dbsql.Query(&q.maxEventSeq, "MaxEventSeq", 0, new(int64), new(int64)),
		dbsql.Query(&q.eventsAfter, "EventsAfter", 2, outboxRowDest(new(outboxRow))...),
	)
}

func outboxRowDest(o *outboxRow) []any {
	return []any{&o.seq, &o.eventID, &o.topic, &o.typ, &o.job, &o.tenant, &o.kind, &o.version, &o.st}
}
