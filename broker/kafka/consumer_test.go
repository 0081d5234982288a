package kafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// Acks out of order: the committed offset stops at the first record not
// settled, however many after it are; a Nacked record comes back to this
// consumer and holds the commit until it is acked.
func TestCommitsOnlyTheSettledPrefix(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			c := tg.setup(t)
			topic, group := c.topic(t, "prefix", 1), c.group("prefix")
			c.publish(t, topic, 5, 1)
			k := c.consumer(t, kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour, NackDelay: 10 * time.Millisecond})
			var ds []broker.Delivery
			for range 5 {
				ds = append(ds, receive(t, k))
			}
			for i, d := range ds {
				require.Equal(t, int64(i), d.Source().Offset)
				require.Equal(t, topic, d.Source().Topic)
			}
			commitAndCheck := func(want int64) {
				t.Helper()
				require.NoError(t, k.Commit(t.Context()))
				got, err := c.committed(t.Context(), group, topic)
				require.NoError(t, err)
				require.Equal(t, want, got[0])
			}
			ctx := t.Context()
			require.NoError(t, ds[1].Ack(ctx))
			require.NoError(t, ds[3].Ack(ctx))
			require.NoError(t, ds[4].Ack(ctx))
			commitAndCheck(0) // offset 0 is pending: nothing past it

			require.NoError(t, ds[0].Ack(ctx))
			commitAndCheck(2) // 0 and 1 done, 2 pending

			require.NoError(t, ds[2].Nack(ctx))
			require.ErrorIs(t, ds[2].Ack(ctx), kafka.ErrAlreadySettled)
			again := receive(t, k)
			require.Equal(t, ds[2].Message().ID, again.Message().ID)
			require.Equal(t, int64(2), again.Source().Offset)
			kd, ok := again.(*kafka.Delivery)
			require.True(t, ok)
			require.Equal(t, 2, kd.Attempt())
			commitAndCheck(2) // still pending after the Nack
			require.NoError(t, again.Ack(ctx))
			commitAndCheck(5)
		})
	}
}

// A rejected record goes to the dead-letter topic with the reason and its
// source, and no longer holds the commit back.
func TestRejectDeadLetters(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			c := tg.setup(t)
			topic, group := c.topic(t, "reject", 1), c.group("reject")
			msgs := c.publish(t, topic, 2, 1)
			k := c.consumer(t, kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour})
			poison, fine := receive(t, k), receive(t, k)
			require.NoError(t, poison.Reject(t.Context(), errors.New("body is not an invoice")))
			require.NoError(t, fine.Ack(t.Context()))
			require.NoError(t, k.Commit(t.Context()))
			got, err := c.committed(t.Context(), group, topic)
			require.NoError(t, err)
			require.Equal(t, int64(2), got[0])

			dlq, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ConsumeTopics(topic+".dlq"))
			require.NoError(t, err)
			defer dlq.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			fetches := dlq.PollRecords(ctx, 1)
			require.NoError(t, fetches.Err())
			r := fetches.Records()[0]
			headers := map[string]string{}
			for _, h := range r.Headers {
				headers[h.Key] = string(h.Value)
			}
			require.Equal(t, msgs[0].ID, headers[kafka.HeaderMessageID])
			require.Equal(t, "body is not an invoice", headers[kafka.HeaderDeadLetterReason])
			require.Equal(t, topic+"/0/0", headers[kafka.HeaderDeadLetterSource])
			require.Equal(t, msgs[0].Body, r.Value)
			require.Equal(t, msgs[0].Key, string(r.Key))
		})
	}
}

// A delivery whose partition moved to another member cannot be acked: the
// Ack says so with ErrRevoked, and the new owner receives the record.
// Deliveries of the partitions kept settle as usual.
func TestAckAfterRevocationFails(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			c := tg.setup(t)
			topic, group := c.topic(t, "revoke", 2), c.group("revoke")
			c.publish(t, topic, 40, 8)
			cfg := kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour}
			first := c.consumer(t, cfg)
			held := map[int32]broker.Delivery{}
			for len(held) < 2 {
				d := receive(t, first)
				if _, ok := held[d.Source().Partition]; !ok {
					held[d.Source().Partition] = d
				}
			}
			second := c.consumer(t, cfg)
			require.Eventually(t, func() bool { return first.Stats().Revocations > 0 && second.Stats().Partitions > 0 }, 30*time.Second, 10*time.Millisecond)

			moved := receive(t, second)
			d := held[moved.Source().Partition]
			require.ErrorIs(t, d.Ack(t.Context()), kafka.ErrRevoked)
			kept := held[1-moved.Source().Partition]
			require.NoError(t, kept.Ack(t.Context()))
			// Nothing was committed for the moved partition: the new owner
			// starts from its first record, the one the Ack could not settle.
			for moved.Source().Offset != d.Source().Offset {
				require.NoError(t, moved.Ack(t.Context()))
				moved = receive(t, second)
			}
			require.Equal(t, d.Message().ID, moved.Message().ID)
		})
	}
}

// Bad configuration is refused with ErrInvalidConfig naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]kafka.ConsumerConfig{
		"Brokers":     {Group: "g", Topics: []string{"t"}},
		"Group":       {Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}},
		"Topics":      {Brokers: []string{"127.0.0.1:1"}, Group: "g"},
		"Topics[1]":   {Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t", ""}},
		"MaxInFlight": {Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, MaxInFlight: -1},
		"NackDelay":   {Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, NackDelay: -time.Second},
	} {
		_, err := kafka.NewConsumer(cfg)
		require.ErrorIs(t, err, kafka.ErrInvalidConfig, name)
		require.ErrorContains(t, err, name)
	}
	for name, cfg := range map[string]kafka.PublisherConfig{
		"Brokers":         {},
		"DeliveryTimeout": {Brokers: []string{"127.0.0.1:1"}, DeliveryTimeout: -1},
		"RecordRetries":   {Brokers: []string{"127.0.0.1:1"}, RecordRetries: -1},
	} {
		_, err := kafka.NewPublisher(cfg)
		require.ErrorIs(t, err, kafka.ErrInvalidConfig, name)
		require.ErrorContains(t, err, name)
	}
}

// Publish refuses messages without ID or Topic by index and produces the
// rest; after Close it returns broker.ErrClosed.
func TestPublishReportsEachMessage(t *testing.T) {
	t.Parallel()
	c := setup(t, "")
	topic := c.topic(t, "publish", 1)
	p := c.publisher(t, kafka.PublisherConfig{})
	err := p.Publish(t.Context(), []broker.Message{
		{ID: "a", Topic: topic, Body: []byte("1")},
		{Topic: topic, Body: []byte("no id")},
		{ID: "c", Body: []byte("no topic")},
		{ID: "d", Topic: topic, Body: []byte("4")},
	})
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 2)
	require.ErrorIs(t, pe.Failed[1], kafka.ErrInvalidMessage)
	require.ErrorIs(t, pe.Failed[2], kafka.ErrInvalidMessage)
	require.Equal(t, map[int32]int64{0: 2}, c.ends(t, topic))

	require.NoError(t, p.Close())
	require.ErrorIs(t, p.Publish(t.Context(), []broker.Message{{ID: "e", Topic: topic}}), broker.ErrClosed)
}
