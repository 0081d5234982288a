package kafka_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker/kafka"
)

// Nobody receives: each partition fills to MaxInFlight and is paused, and
// the member stays in the group for three session timeouts (no revocation,
// no loss, nothing more fetched). A second member joins while the first is
// paused: the partitions the first keeps stay paused with their records,
// the one it gives up is resumed there and consumed by the newcomer. Once
// receivers drain both, every partition resumes and every record arrives.
func TestPausedPartitionsKeepTheMemberInTheGroup(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			c := tg.setup(t)
			topic, group := c.topic(t, "pause", 3), c.group("pause")
			const n = 150
			c.publish(t, topic, n, 15)
			filled := 0
			for _, end := range c.ends(t, topic) {
				if end > 0 {
					filled++
				}
			}
			cfg := kafka.ConsumerConfig{Group: group, Topics: []string{topic}, MaxInFlight: 8, CommitInterval: 20 * time.Millisecond}
			k1 := c.consumer(t, cfg)
			require.Eventually(t, func() bool { return len(k1.Stats().Paused[topic]) == filled }, 30*time.Second, 10*time.Millisecond)
			inFlight := k1.Stats().InFlight
			require.GreaterOrEqual(t, inFlight, 8*filled)
			require.Less(t, inFlight, 2*8*filled, "pausing bounds what is fetched")

			require.Never(t, func() bool {
				st := k1.Stats()
				return st.Revocations+st.Losses > 0 || st.InFlight != inFlight || len(st.Paused[topic]) != filled
			}, 3*c.sessionTimeout, 50*time.Millisecond)
			described, err := c.adm.DescribeGroups(t.Context(), group)
			require.NoError(t, err)
			require.Equal(t, "Stable", described[group].State)
			require.Len(t, described[group].Members, 1)

			k2 := c.consumer(t, cfg)
			require.Eventually(t, func() bool { return k1.Stats().Revocations > 0 && k2.Stats().Partitions > 0 }, 30*time.Second, 10*time.Millisecond)
			st := k1.Stats()
			require.Zero(t, st.Losses)
			require.Len(t, st.Paused[topic], st.Partitions, "the partitions kept stay paused, the one given up is resumed")
			require.Less(t, st.InFlight, inFlight)

			// Drain both members.
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			var mu sync.Mutex
			seen := map[string]bool{}
			var wg sync.WaitGroup
			for _, k := range []*kafka.Consumer{k1, k2} {
				wg.Go(func() {
					for {
						d, err := k.Receive(ctx)
						if err != nil {
							return
						}
						mu.Lock()
						seen[d.Message().ID] = true
						all := len(seen) == n
						mu.Unlock()
						if d.Ack(ctx) != nil || all {
							cancel()
						}
					}
				})
			}
			wg.Wait()
			require.Len(t, seen, n)
			for _, k := range []*kafka.Consumer{k1, k2} {
				require.Eventually(t, func() bool {
					st := k.Stats()
					return len(st.Paused) == 0 && st.InFlight == 0
				}, 10*time.Second, 10*time.Millisecond)
			}
		})
	}
}
