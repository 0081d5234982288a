package telemetrytest

import (
	"bytes"
	"sync"
)

// LogBuffer is a bytes.Buffer safe for the concurrent writes of a logger
// (slog handlers write from every goroutine that logs), for tests that
// read what was logged.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
