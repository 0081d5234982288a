package jobs

import (
	"sync"
	"time"
)

// notifyLimiter decides which enqueues send a NOTIFY. With a negative
// interval every enqueue does; otherwise at most one per queue per
// interval from this store, which keeps most accepting transactions off
// Postgres' notify lock (see Config.NotifyInterval).
type notifyLimiter struct {
	disabled bool
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time // queue → when this store last notified it
}

func newNotifyLimiter(disabled bool, interval time.Duration) *notifyLimiter {
	return &notifyLimiter{disabled: disabled, interval: interval, last: map[string]time.Time{}}
}

// queues returns the queues, among those given, to notify now. The result
// is never nil: InsertJobs must see an empty array, not NULL.
func (l *notifyLimiter) queues(queues []string, now time.Time) []string {
	out := make([]string, 0, 1)
	if l.disabled {
		return out
	}
	if l.interval < 0 {
		for _, q := range queues {
			if !contains(out, q) {
				out = append(out, q)
			}
		}
		return out
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range queues {
		if contains(out, q) {
			continue
		}
		if last, ok := l.last[q]; ok && now.Sub(last) < l.interval {
			continue
		}
		l.last[q] = now
		out = append(out, q)
	}
	return out
}

// contains is a linear search: a batch names very few distinct queues.
func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
