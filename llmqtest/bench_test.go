package llmqtest_test

import (
	"slices"
	"testing"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtest"
)

// BenchmarkTestDB compares a test database from the schema pool (after the
// first, a cleared schema) with what internal/dbtest does for each test
// (create and migrate a schema, drop it at the end), set-up and clean-up
// included:
//
//	go test -run '^$' -bench TestDB -benchtime 20x ./llmqtest/
func BenchmarkTestDB(b *testing.B) {
	b.Run("pooled", func(b *testing.B) {
		for b.Loop() {
			scoped(b, func(tb testing.TB) { tb.Helper(); llmqtest.NewDB(tb) })
		}
	})
	b.Run("fresh", func(b *testing.B) {
		for b.Loop() {
			scoped(b, func(tb testing.TB) { tb.Helper(); dbtest.Setup(tb) })
		}
	})
}

// scopedTB runs the cleanups registered on it when scoped returns, as a
// test's end would.
type scopedTB struct {
	testing.TB
	cleanups []func()
}

func (s *scopedTB) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }

func scoped(b *testing.B, setup func(testing.TB)) {
	b.Helper()
	tb := &scopedTB{TB: b}
	setup(tb)
	for _, f := range slices.Backward(tb.cleanups) {
		f()
	}
}
