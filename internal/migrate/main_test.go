package migrate_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started (the
// upgrade test's runner and relay) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
