package console

import (
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/internal/dbsql"
)

// QueryForTest returns the rendered statement name of a handler built by
// New, for the plan tests.
func QueryForTest(h any, name string) string {
	sql, ok := statementsForTest(h).SQL(name)
	if !ok {
		panic("console: no statement named " + name)
	}
	return sql
}

func handler(h any) *Handler {
	hh, ok := h.(*Handler)
	if !ok {
		panic("console: not a console handler")
	}
	return hh
}

// statementsForTest loads the statements again, for the handler's schema,
// to look them up by name.
func statementsForTest(h any) dbsql.Set {
	schema, err := dbsql.NewSchema(handler(h).cfg.Schema)
	if err != nil {
		panic(err)
	}
	var q statements
	set, err := q.load(schema)
	if err != nil {
		panic(err)
	}
	return set
}

// QueryNamesForTest lists the statements of queries.sql.
func QueryNamesForTest(h any) []string {
	var names []string
	for _, s := range statementsForTest(h).Specs {
		names = append(names, s.Name())
	}
	return names
}

// UUIDAtForTest is uuidAt, for the plan tests' parameters.
func UUIDAtForTest(t time.Time) uuid.UUID { return uuidAt(t) }

// SetChartCapForTest lowers the chart's per-minute cap.
func SetChartCapForTest(h any, n int) { handler(h).chartCap = n }

// SetEventScanLimitForTest lowers the outbox entries read per end of a
// job's event range.
func SetEventScanLimitForTest(h any, n int) { handler(h).eventScanLimit = n }

// RangeScansOnlySQL is what the counting statements run under.
const RangeScansOnlySQL = rangeScansOnlySQL
