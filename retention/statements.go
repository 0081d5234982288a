package retention

import (
	"time"

	"github.com/llmq/llmq/internal/dbsql"
)

// statements is every statement of queries.sql, with the shape the code
// binds and scans; dbsqltest checks it against the schema.
type statements struct {
	acquireLease, fenceBatch, readLease, recordPass, releaseLease string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Query(&q.acquireLease, "AcquireLease", 3, new(bool)),
		dbsql.Query(&q.fenceBatch, "FenceBatch", 2, new(bool)),
		dbsql.Query(&q.readLease, "ReadLease", 0, new(leaseRow).dest()...),
		dbsql.Exec(&q.recordPass, "RecordPass", 2),
		dbsql.Exec(&q.releaseLease, "ReleaseLease", 1),
	)
}

// leaseRow is the ReadLease row as Status scans it.
type leaseRow struct {
	st                      *Status
	until, acquired, lastAt *time.Time // NULL: never held, or released; acquired is not reported
	policy, last            []byte
}

func (r *leaseRow) dest() []any {
	if r.st == nil {
		r.st = new(Status)
	}
	return []any{&r.st.Holder, &r.until, &r.st.Held, &r.acquired, &r.policy, &r.lastAt, &r.last, &r.st.Now}
}
