package jobs_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started (a claim, a listener or a notify timer)
// outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
