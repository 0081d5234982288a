package kafka_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// The coordinator forgets the member (UNKNOWN_MEMBER_ID on a heartbeat):
// its partitions are lost. Nothing is committed, not even the acked prefix,
// since another member may own them already; the outstanding deliveries
// return ErrRevoked; after rejoining the consumer receives the records
// again from the last commit.
func TestLostPartitionsAreDroppedWithoutCommit(t *testing.T) {
	t.Parallel()
	c := setup(t, "") // kfake only: a real cluster cannot be told to forget a member
	topic, group := c.topic(t, "lost", 1), c.group("lost")
	msgs := c.publish(t, topic, 3, 1)
	k := c.consumer(t, kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour})
	first, second := receive(t, k), receive(t, k)
	require.NoError(t, first.Ack(t.Context()))

	c.fake.ControlKey(kmsg.Heartbeat.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		resp := r.ResponseKind().(*kmsg.HeartbeatResponse) //nolint:errcheck,forcetypeassert // a heartbeat's response
		resp.Version = r.GetVersion()
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	require.Eventually(t, func() bool { return k.Stats().Losses == 1 }, 30*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, second.Ack(t.Context()), kafka.ErrRevoked)
	got, err := c.committed(t.Context(), group, topic)
	require.NoError(t, err)
	require.Zero(t, got[0], "a lost partition commits nothing")

	again := receive(t, k)
	require.Equal(t, msgs[0].ID, again.Message().ID, "redelivered from the last commit")
	require.Zero(t, k.Stats().Revocations)
}

// Close commits the settled prefix and leaves; the deliveries it leaves
// unsettled fail with broker.ErrClosed and go to the next member.
func TestCloseCommitsTheSettledPrefix(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			c := tg.setup(t)
			topic, group := c.topic(t, "close", 1), c.group("close")
			msgs := c.publish(t, topic, 4, 1)
			cfg := kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour}
			k := c.consumer(t, cfg)
			ds := []broker.Delivery{receive(t, k), receive(t, k), receive(t, k)}
			require.NoError(t, ds[0].Ack(t.Context()))
			require.NoError(t, ds[1].Ack(t.Context()))
			require.NoError(t, k.Close())
			require.ErrorIs(t, ds[2].Ack(t.Context()), broker.ErrClosed)
			_, err := k.Receive(t.Context())
			require.ErrorIs(t, err, broker.ErrClosed)
			require.NoError(t, k.Close(), "Close is idempotent")

			got, err := c.committed(t.Context(), group, topic)
			require.NoError(t, err)
			require.Equal(t, int64(2), got[0])
			next := c.consumer(t, cfg)
			require.Equal(t, msgs[2].ID, receive(t, next).Message().ID)
		})
	}
}
