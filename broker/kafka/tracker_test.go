package kafka

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestTracker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		fetched  []int64
		done     []int64
		commit   int64 // -1: nothing committable
		inFlight int
	}{
		{name: "nothing fetched", commit: -1},
		{name: "nothing done", fetched: []int64{0, 1, 2}, commit: -1, inFlight: 3},
		{name: "in order", fetched: []int64{0, 1, 2}, done: []int64{0, 1}, commit: 2, inFlight: 1},
		{name: "all done", fetched: []int64{0, 1, 2}, done: []int64{0, 1, 2}, commit: 3},
		{name: "41 done, 40 pending", fetched: []int64{40, 41}, done: []int64{41}, commit: -1, inFlight: 2},
		{name: "out of order, gap closes", fetched: []int64{40, 41, 42}, done: []int64{42, 41, 40}, commit: 43},
		{name: "hole in the middle", fetched: []int64{0, 1, 2, 3, 4}, done: []int64{0, 1, 3, 4}, commit: 2, inFlight: 3},
		{name: "offset gaps (compaction, markers)", fetched: []int64{5, 9, 12}, done: []int64{5, 9}, commit: 10, inFlight: 1},
		{name: "unknown offset ignored", fetched: []int64{0, 1}, done: []int64{7, 0}, commit: 1, inFlight: 1},
		{name: "done twice", fetched: []int64{0, 1}, done: []int64{0, 0}, commit: 1, inFlight: 1},
		{name: "re-fetch refused", fetched: []int64{0, 1, 1, 0}, done: []int64{0, 1}, commit: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := newTracker()
			for _, o := range tc.fetched {
				tr.add(o, 3)
			}
			for _, o := range tc.done {
				tr.done(o)
			}
			off, epoch, ok := tr.committable()
			require.Equal(t, tc.commit >= 0, ok)
			if ok {
				require.Equal(t, tc.commit, off)
				require.Equal(t, int32(3), epoch)
			}
			require.Equal(t, tc.inFlight, tr.inFlight())
		})
	}
}

// FuzzTracker settles fetched offsets in an arbitrary order: the committable
// offset never passes an offset not yet done, and reaches one past the last
// once all are.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, []byte{3, 2, 1, 0})
	f.Add([]byte{5, 1, 9}, []byte{1, 0})
	f.Add([]byte{}, []byte{7})
	f.Fuzz(func(t *testing.T, gaps, order []byte) {
		tr := newTracker()
		var offsets []int64
		next := int64(0)
		for _, g := range gaps {
			next += int64(g%4) + 1
			require.True(t, tr.add(next, 0))
			offsets = append(offsets, next)
		}
		done := map[int64]bool{}
		settle := func(o int64) {
			tr.done(o)
			done[o] = true
			off, _, ok := tr.committable()
			for _, o := range offsets {
				if !done[o] {
					require.False(t, ok && off > o, "committable %d passes pending %d", off, o)
					return
				}
			}
		}
		for _, b := range order {
			if len(offsets) > 0 {
				settle(offsets[int(b)%len(offsets)])
			}
		}
		for _, o := range slices.Backward(offsets) {
			settle(o)
		}
		require.Zero(t, tr.inFlight())
		if len(offsets) > 0 {
			off, _, ok := tr.committable()
			require.True(t, ok)
			require.Equal(t, offsets[len(offsets)-1]+1, off)
		}
	})
}

// FuzzRecordToMessage reads arbitrary records: it never panics, the id is
// the last id header, a null value stays nil and an empty one non-nil,
// null keys and header values are "", a repeated header keeps its last
// value, and a message built from the result round-trips with a non-null
// value.
func FuzzRecordToMessage(f *testing.F) {
	f.Add([]byte("llmq-event-id"), []byte("evt-1"), []byte("k"), []byte(`{"a":1}`), uint8(0))
	f.Add([]byte(""), []byte(""), []byte(""), []byte(""), uint8(0))
	f.Add([]byte("traceparent"), []byte{0xff, 0}, []byte{0}, []byte{}, uint8(7))
	f.Add([]byte("h"), []byte("v"), []byte("k"), []byte("x"), uint8(15))
	f.Fuzz(func(t *testing.T, hk, hv, key, value []byte, nulls uint8) {
		// nulls' bits make the key, the value, the header's value null, and
		// repeat the header with a first value that must not survive.
		if nulls&1 != 0 {
			key = nil
		} else if key == nil {
			key = []byte{}
		}
		if nulls&2 != 0 {
			value = nil
		} else if value == nil {
			value = []byte{}
		}
		if nulls&4 != 0 {
			hv = nil
		}
		headers := []kgo.RecordHeader{{Key: HeaderMessageID, Value: binary.AppendUvarint(nil, uint64(len(hv)))}}
		if nulls&8 != 0 {
			headers = append(headers, kgo.RecordHeader{Key: string(hk), Value: []byte("overwritten")})
		}
		headers = append(headers, kgo.RecordHeader{Key: string(hk), Value: hv})
		r := &kgo.Record{Topic: "t", Key: key, Value: value, Headers: headers}
		msg := toMessage(r)
		want := string(binary.AppendUvarint(nil, uint64(len(hv))))
		if string(hk) == HeaderMessageID {
			want = string(hv)
		}
		require.Equal(t, want, msg.ID)
		require.Equal(t, string(key), msg.Key)
		require.Equal(t, string(hv), msg.Headers[string(hk)], "the last value of a repeated header; null is empty")
		require.Equal(t, value == nil, msg.Body == nil, "a null value, and only a null value, is a nil Body")
		require.Equal(t, string(value), string(msg.Body))

		rec := toRecord(msg)
		require.NotNil(t, rec.Value, "the publisher never writes a tombstone")
		back := toMessage(rec)
		require.Equal(t, msg.ID, back.ID)
		require.Equal(t, msg.Key, back.Key)
		require.Equal(t, msg.Headers, back.Headers)
		require.Equal(t, string(msg.Body), string(back.Body))
		require.NotNil(t, back.Body)
	})
}

// BenchmarkTracker tracks and settles 1,000 records in reverse order, the
// worst case for the prefix: nothing is committable until the last.
func BenchmarkTracker(b *testing.B) {
	for b.Loop() {
		tr := newTracker()
		for o := range int64(1000) {
			tr.add(o, 0)
		}
		for o := int64(999); o >= 0; o-- {
			tr.done(o)
		}
	}
}
