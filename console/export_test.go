package console

import (
	"time"

	"github.com/google/uuid"
)

// QueryForTest returns the rendered statement name of a handler built by
// New, for the plan tests.
func QueryForTest(h any, name string) string { return handler(h).q.Must(name) }

func handler(h any) *Handler {
	hh, ok := h.(*Handler)
	if !ok {
		panic("console: not a console handler")
	}
	return hh
}

// QueryNamesForTest lists the statements of queries.sql.
func QueryNamesForTest(h any) []string {
	var names []string
	for name := range handler(h).q {
		names = append(names, name)
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
