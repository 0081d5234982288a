package webhook_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started (a
// runner, a dispatcher's attempt, a test server's handler) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
