package llmqtest_test

import (
	"os"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtest"
)

// TestMeasureSchemaPool compares a test database from the schema pool
// (after the first, a reset of a migrated schema) with what internal/dbtest
// does for each test (create and migrate a schema, drop it at the end),
// set-up and clean-up included. It measures only when asked:
//
//	LLMQTEST_MEASURE=1 go test -run TestMeasureSchemaPool -v ./llmqtest/
func TestMeasureSchemaPool(t *testing.T) {
	t.Parallel()
	if os.Getenv("LLMQTEST_MEASURE") == "" {
		t.Skip("a measurement, not a check: set LLMQTEST_MEASURE=1 to run it")
	}
	const n = 20
	for _, c := range []struct {
		name  string
		setup func(testing.TB)
	}{
		{"pooled", func(tb testing.TB) { llmqtest.NewDB(tb) }},
		{"fresh", func(tb testing.TB) { dbtest.Setup(tb) }},
	} {
		var total time.Duration
		for range n {
			start := time.Now()
			t.Run(c.name, func(t *testing.T) { c.setup(t) }) // the cleanup runs when the subtest ends
			total += time.Since(start)
		}
		t.Logf("%s: %.1f ms per test database", c.name, float64(total.Microseconds())/1000/n)
	}
}
