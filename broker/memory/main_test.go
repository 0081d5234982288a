package memory_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started (the broker's Receive waiters and redelivery timers)
// outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
