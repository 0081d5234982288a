package invoice

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started (an
// event stream's reader, a server's handlers) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
