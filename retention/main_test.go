package retention_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// The test binary re-executes itself as a pruning process for the tests
// that need several processes, or to kill one.
const childEnv = "LLMQ_RETENTION_TEST_CHILD"

// Run starts no goroutine that outlives it.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "pruner" {
		os.Exit(runChildPruner())
	}
	goleak.VerifyTestMain(m)
}
