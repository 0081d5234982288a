package kafka

import "sort"

// tracker follows one partition's records from fetch to settlement and
// says how far the partition may be committed: up to the first record
// that is not done. Offsets are not assumed contiguous (compaction and
// transaction markers leave gaps), so it keeps the fetched offsets
// themselves, in fetch order, and commits one past the last record of the
// done prefix.
type tracker struct {
	pending []trackedRecord // fetched, ascending offsets; the head is not done
	commit  int64           // the offset to commit: one past the done prefix; -1 before any
	epoch   int32           // leader epoch of the record before commit
	last    int64           // the highest offset added; -1 before any
}

type trackedRecord struct {
	offset int64
	epoch  int32
	done   bool
}

func newTracker() *tracker { return &tracker{commit: -1, last: -1} }

// add tracks a fetched record. A record at or below the highest offset
// already tracked is refused (false): a re-fetch must not re-open an
// offset that may already be committed.
func (t *tracker) add(offset int64, epoch int32) bool {
	if offset <= t.last {
		return false
	}
	t.last = offset
	t.pending = append(t.pending, trackedRecord{offset: offset, epoch: epoch})
	return true
}

// done marks offset settled and advances the committable prefix. An
// offset not tracked, or already done, changes nothing.
func (t *tracker) done(offset int64) {
	i := sort.Search(len(t.pending), func(i int) bool { return t.pending[i].offset >= offset })
	if i == len(t.pending) || t.pending[i].offset != offset || t.pending[i].done {
		return
	}
	t.pending[i].done = true
	n := 0
	for n < len(t.pending) && t.pending[n].done {
		n++
	}
	if n > 0 {
		head := t.pending[n-1]
		t.commit, t.epoch = head.offset+1, head.epoch
		t.pending = t.pending[n:]
		if len(t.pending) == 0 {
			t.pending = nil // let the old backing array go
		}
	}
}

// committable returns the offset to commit (one past the done prefix) and
// its leader epoch; ok is false while no record is done.
func (t *tracker) committable() (offset int64, epoch int32, ok bool) {
	return t.commit, t.epoch, t.commit >= 0
}

// inFlight counts the records not yet in the done prefix: fetched and
// unsettled, or settled behind one that is not.
func (t *tracker) inFlight() int { return len(t.pending) }
