package retention_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Run starts no goroutine that outlives it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
