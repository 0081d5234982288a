package llmqtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every runner WorkUntilIdle starts is stopped before it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
