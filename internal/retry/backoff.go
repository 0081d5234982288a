package retry

import (
	"context"
	"time"

	"github.com/llmq/llmq/llmqtype"
)

// Policy is llmqtype.BackoffPolicy, defined there so that public packages
// can take it.
type Policy = llmqtype.BackoffPolicy

// The backoff defaults and the Retry-After bound, defined in llmqtype.
const (
	DefaultBase   = llmqtype.DefaultBackoffBase
	DefaultCap    = llmqtype.DefaultBackoffCap
	MaxRetryAfter = llmqtype.MaxRetryAfter
)

// ErrInvalidPolicy is llmqtype.ErrInvalidBackoffPolicy.
var ErrInvalidPolicy = llmqtype.ErrInvalidBackoffPolicy

// Sleep waits for d or until ctx ends, and reports whether the full wait
// passed: the one way llmq waits between tries, never holding anything.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
