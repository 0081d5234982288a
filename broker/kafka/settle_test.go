package kafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// A verdict given with an ended context (a settle deadline used up by an
// earlier, slow settle) never strands its record: Ack and Nack take effect
// all the same, and a Reject whose dead-letter produce cannot run hands
// the record back. The partition commits past every one of them.
func TestSettleWithAnEndedContextStrandsNothing(t *testing.T) {
	t.Parallel()
	c := setup(t, "")
	topic, group := c.topic(t, "ended", 1), c.group("ended")
	c.publish(t, topic, 3, 1)
	k := c.consumer(t, kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour, NackDelay: time.Millisecond})
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	var ds []broker.Delivery
	for range 3 {
		ds = append(ds, receive(t, k))
	}
	require.NoError(t, ds[0].Ack(ended))
	require.NoError(t, ds[1].Nack(ended))
	require.ErrorIs(t, ds[2].Reject(ended, errors.New("bad")), context.Canceled)
	again := map[int64]broker.Delivery{}
	for range 2 {
		d := receive(t, k)
		again[d.Source().Offset] = d
	}
	require.Contains(t, again, int64(1), "nacked: delivered again")
	require.Contains(t, again, int64(2), "reject failed: handed back")
	require.ErrorIs(t, ds[0].Ack(t.Context()), kafka.ErrAlreadySettled)
	for _, d := range again {
		require.NoError(t, d.Ack(t.Context()))
	}
	require.NoError(t, k.Commit(t.Context()))
	got, err := c.committed(t.Context(), group, topic)
	require.NoError(t, err)
	require.Equal(t, int64(3), got[0])
}
