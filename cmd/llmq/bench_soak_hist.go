package main

import (
	"math"
	"time"
)

// latencyHist is a fixed-size histogram of latencies, so a soak of any
// length holds the same memory: buckets grow by 2 % from 10 µs, the top
// one's upper bound is 10 µs × 1.02^999, about 65 minutes, and a
// percentile read from them is within 2 % of the exact one up to there.
// Longer latencies are counted in the top bucket and read as 65 minutes.
type latencyHist struct {
	counts [latencyBuckets]int64
	n      int64
}

const (
	latencyMin     = 10 * time.Microsecond
	latencyGrowth  = 1.02
	latencyBuckets = 1000 // the top bucket's upper bound: latencyMin × 1.02^999 ≈ 65 minutes
)

func (h *latencyHist) add(d time.Duration) {
	i := 0
	if d > latencyMin {
		i = min(int(math.Log(float64(d)/float64(latencyMin))/math.Log(latencyGrowth))+1, latencyBuckets-1)
	}
	h.counts[i]++
	h.n++
}

// p99ms is the 99th percentile in milliseconds (the upper bound of its
// bucket), 0 when empty.
func (h *latencyHist) p99ms() float64 {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(0.99 * float64(h.n)))
	var seen int64
	for i, c := range &h.counts {
		seen += c
		if seen >= rank {
			upper := float64(latencyMin) * math.Pow(latencyGrowth, float64(i))
			return upper / float64(time.Millisecond)
		}
	}
	return 0 // unreachable: the counts sum to n
}
