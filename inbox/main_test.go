package inbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine an ingress starts ends with its Run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
