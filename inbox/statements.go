package inbox

import (
	"time"

	"github.com/llmq/llmq/internal/dbsql"
)

// statements is every statement of queries.sql and prune.sql, with the
// shape the code binds and scans; dbsqltest checks it against the schema.
type statements struct {
	insert, selectOne, quarantine, listQuarantine, prune string
	insertMany, selectMany                               string // the ingress's batches
	count, oldest                                        string
	pruneQuarantine, countQuarantine, oldestQuarantine   string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL, pruneSQL},
		dbsql.Query(&q.insert, "InsertMessage", 4, new(bool)),
		dbsql.Query(&q.selectOne, "SelectMessage", 2, new(string), new(string)),
		dbsql.Query(&q.quarantine, "InsertQuarantine", 10, new(int64)),
		dbsql.Query(&q.listQuarantine, "ListQuarantine", 2, new(quarantinedRow).dest()...),
		dbsql.Exec(&q.prune, "PruneMessages", 2),
		dbsql.Query(&q.insertMany, "InsertMessages", 4, new(string)),
		dbsql.Query(&q.selectMany, "SelectMessages", 2, new(string), new(string)),
		dbsql.Query(&q.count, "CountMessages", 1, new(int64)),
		dbsql.Query(&q.oldest, "OldestMessage", 0, new(*time.Time)),
		dbsql.Exec(&q.pruneQuarantine, "PruneQuarantine", 2),
		dbsql.Query(&q.countQuarantine, "CountQuarantine", 1, new(int64)),
		dbsql.Query(&q.oldestQuarantine, "OldestQuarantine", 0, new(*time.Time)),
	)
}

// quarantinedRow is a ListQuarantine row as scanned.
type quarantinedRow struct {
	q                  Quarantined
	messageID          *string
	source, rawID      []byte
	rawKeys, rawValues [][]byte
}

func (r *quarantinedRow) dest() []any {
	return []any{&r.q.ID, &r.q.Consumer, &r.messageID, &r.q.PayloadDigest, &r.source, &r.q.Headers, &r.q.Payload,
		&r.q.Reason, &r.q.ReceivedAt, &r.rawID, &r.rawKeys, &r.rawValues}
}
