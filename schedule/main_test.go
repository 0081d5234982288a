package schedule_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine a scheduler started
// (its renewal) outlives Run.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "scheduler" {
		os.Exit(runChildScheduler())
	}
	goleak.VerifyTestMain(m)
}
