package kafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a consumer, publisher or ingress starts ends with its Close or Run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
