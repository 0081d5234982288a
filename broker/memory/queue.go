package memory

import (
	"container/heap"
	"time"

	"github.com/llmq/llmq/broker"
)

// entry is one message in a topic's queue, with its delivery history.
type entry struct {
	msg      broker.Message
	seq      uint64    // publish order; a redelivered message keeps it, so it keeps its place
	attempts int       // deliveries so far
	readyAt  time.Time // when a Nacked message may be delivered again
}

// topic is one topic's queue. At most one message of each key is out (ready,
// waiting out a redelivery delay, or delivered and unsettled); the key's
// later messages wait behind it in keys. That single rule gives both per-key
// order and "never two of a key in flight", and lets every other message be
// picked from a heap instead of scanning past blocked keys.
//
// Every method expects the broker's lock held.
type topic struct {
	name    string
	ready   entryHeap           // deliverable now, lowest seq first
	delayed entryHeap           // Nacked, waiting out RedeliveryDelay, earliest first
	keys    map[string][]*entry // a key is present while its head is out; the value is its waiting messages
	dead    []broker.Message    // rejected, in rejection order
	wake    chan struct{}       // closed when a message becomes ready or delayed
	armed   bool                // someone holds wake, so signal must close it

	published int
}

func newTopic(name string) *topic {
	return &topic{
		name:    name,
		ready:   entryHeap{less: func(a, b *entry) bool { return a.seq < b.seq }},
		delayed: entryHeap{less: readyFirst},
		keys:    map[string][]*entry{},
		wake:    make(chan struct{}),
	}
}

// readyFirst orders delayed messages by when they become ready, then by
// publish order.
func readyFirst(a, b *entry) bool {
	if !a.readyAt.Equal(b.readyAt) {
		return a.readyAt.Before(b.readyAt)
	}
	return a.seq < b.seq
}

// enqueue adds a newly published message: ready at once unless a message of
// its key is out, in which case it waits behind it.
func (t *topic) enqueue(e *entry) {
	t.published++
	if key := e.msg.Key; key != "" {
		if waiting, out := t.keys[key]; out {
			t.keys[key] = append(waiting, e)
			return
		}
		t.keys[key] = nil
	}
	heap.Push(&t.ready, e)
	t.signal()
}

// take removes and returns the ready message that was published first, or
// nil. Messages whose redelivery delay ended by now become ready first.
func (t *topic) take(now time.Time) *entry {
	for t.delayed.Len() > 0 && !t.delayed.items[0].readyAt.After(now) {
		heap.Push(&t.ready, heap.Pop(&t.delayed))
	}
	if t.ready.Len() == 0 {
		return nil
	}
	e, _ := heap.Pop(&t.ready).(*entry)
	e.attempts++
	return e
}

// requeue puts a delivered message back as its key's head, ready at readyAt.
// Its key stays out, so the key's later messages keep waiting behind it.
func (t *topic) requeue(e *entry, readyAt, now time.Time) {
	e.readyAt = readyAt
	if readyAt.After(now) {
		heap.Push(&t.delayed, e)
	} else {
		heap.Push(&t.ready, e)
	}
	// A delayed message wakes waiters too: they must wait for it with a
	// timer, and the one they have may be set for later.
	t.signal()
}

// done retires a delivered message for good (acknowledged or rejected) and
// releases its key to the next waiting message.
func (t *topic) done(e *entry) {
	key := e.msg.Key
	if key == "" {
		return
	}
	waiting := t.keys[key]
	if len(waiting) == 0 {
		delete(t.keys, key)
		return
	}
	next := waiting[0]
	waiting[0] = nil // the backing array must not keep it alive
	t.keys[key] = waiting[1:]
	heap.Push(&t.ready, next)
	t.signal()
}

// waitFor returns a channel closed at the next change that might let a
// receiver take a message, and the time the earliest delayed message becomes
// ready, if there is one.
func (t *topic) waitFor() (changed <-chan struct{}, next time.Time, delayed bool) {
	t.armed = true
	if t.delayed.Len() > 0 {
		return t.wake, t.delayed.items[0].readyAt, true
	}
	return t.wake, time.Time{}, false
}

// signal wakes every receiver waiting on the topic. Channels are replaced
// only when someone waits on them, so publishing to an idle topic allocates
// nothing.
func (t *topic) signal() {
	if t.armed {
		close(t.wake)
		t.wake = make(chan struct{})
		t.armed = false
	}
}

// entryHeap is a container/heap of entries ordered by less.
type entryHeap struct {
	items []*entry
	less  func(a, b *entry) bool
}

func (h *entryHeap) Len() int           { return len(h.items) }
func (h *entryHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *entryHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }

func (h *entryHeap) Push(x any) {
	e, _ := x.(*entry)
	h.items = append(h.items, e)
}

func (h *entryHeap) Pop() any {
	n := len(h.items) - 1
	e := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	return e
}
