package llmq_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started (the fleet test's runner, relay, ingress and samplers)
// outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
