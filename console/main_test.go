package console_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine they started (a
// server, a browser connection, a pool) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
