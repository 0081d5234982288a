package admission

// QueuedAcquires reports how many acquires wait in pool's queue in this
// process, not yet taken by a cycle: tests use it to know that a waiter
// is queued before they act.
func QueuedAcquires(l *Postgres, pool string) int {
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	if q := l.qs.byPool[pool]; q != nil {
		return len(q.acquires)
	}
	return 0
}
