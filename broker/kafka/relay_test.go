package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// failProduce makes the kfake cluster answer produce requests with a
// retriable error: two requests of every three until it answered failures
// times (NOT_ENOUGH_REPLICAS: the record was not appended). It returns how
// many it answered so.
func failProduce(c *cluster, failures int32) *atomic.Int32 {
	var seen, failed atomic.Int32
	c.fake.ControlKey(kmsg.Produce.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.fake.KeepControl()
		if seen.Add(1)%3 == 0 || failed.Load() >= failures {
			return nil, nil, false // the cluster handles it
		}
		failed.Add(1)
		return produceError(r, kerr.NotEnoughReplicas), nil, true
	})
	return &failed
}

// produceError answers a produce request with err for every partition in it.
func produceError(r kmsg.Request, err *kerr.Error) kmsg.Response {
	req := r.(*kmsg.ProduceRequest)                    //nolint:errcheck,forcetypeassert // the control key is Produce
	resp := req.ResponseKind().(*kmsg.ProduceResponse) //nolint:errcheck,forcetypeassert // a produce request's response
	resp.Version = req.Version
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, err.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// The broker refuses most produce requests for a while; the publisher gives
// up on a record after one retry, so the relay sees failures and retries
// them with backoff. Every event arrives, and the first arrival of each
// follows write order within its key.
func TestRelayRetriesInjectedProduceErrors(t *testing.T) {
	t.Parallel()
	c := setup(t, "") // kfake only: a real cluster cannot be told to fail
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 8})
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	topic := c.topic(t, "relay", 3)
	const events, keys = 400, 8
	for batch := range events / 50 {
		require.NoError(t, pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
			for i := batch * 50; i < (batch+1)*50; i++ {
				_, err := store.Write(t.Context(), tx, outbox.Event{
					Topic: topic, Key: fmt.Sprintf("key-%d", i%keys), Type: "invoice.changed",
					Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
				})
				if err != nil {
					return err
				}
			}
			return nil
		}))
	}

	injected := failProduce(c, 60)
	// A retriable error refreshes metadata before the retry, at most once
	// per MetadataMinAge (5s by default): shortened to keep the test short.
	pub := c.publisher(t, kafka.PublisherConfig{RecordRetries: 1, DeliveryTimeout: 10 * time.Second, Options: []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond)}})
	// Claims smaller than the backlog, so that refused events back off
	// while later claims go on.
	relay, err := store.NewRelay(db.Pool, pub, outbox.RelayConfig{
		BatchSize: 50, PollInterval: 20 * time.Millisecond,
		Backoff: llmqtype.BackoffPolicy{Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond},
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool {
		st, err := relay.Stats(t.Context())
		return err == nil && st.Pending == 0
	}, 60*time.Second, 20*time.Millisecond)
	st, err := relay.Stats(t.Context())
	require.NoError(t, err)
	require.Positive(t, st.Failed, "the relay saw failed publications")
	require.Positive(t, injected.Load())

	seqOf := map[string]int64{}
	rows, err := db.Pool.Query(t.Context(), "SELECT event_id::text, seq FROM "+db.Schema+".outbox")
	require.NoError(t, err)
	type written struct {
		id  string
		seq int64
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (written, error) {
		var w written
		return w, row.Scan(&w.id, &w.seq)
	})
	require.NoError(t, err)
	for _, w := range all {
		seqOf[w.id] = w.seq
	}
	require.Len(t, seqOf, events)

	k := c.consumer(t, kafka.ConsumerConfig{Group: c.group("relay"), Topics: []string{topic}})
	last := map[string]int64{}
	seen := map[string]bool{}
	for len(seen) < events {
		d := receive(t, k)
		m := d.Message()
		require.NoError(t, d.Ack(t.Context()))
		if seen[m.ID] {
			continue // a duplicate: at-least-once
		}
		seen[m.ID] = true
		require.Contains(t, seqOf, m.ID)
		require.Greater(t, seqOf[m.ID], last[m.Key], "key %s out of order", m.Key)
		last[m.Key] = seqOf[m.ID]
		require.Equal(t, "invoice.changed", m.Headers[outbox.HeaderEventType])
	}
}

// The broker refuses the first produce request outright: its records fail,
// and the later message of a failed key is not produced at all (it would
// otherwise land ahead of its predecessor's retry). The next call goes
// through.
func TestPublishFailsTheRestOfAFailedKey(t *testing.T) {
	t.Parallel()
	c := setup(t, "")
	topic := c.topic(t, "chain", 1)
	c.fake.ControlKey(kmsg.Produce.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		return produceError(r, kerr.InvalidRecord), nil, true
	})
	pub := c.publisher(t, kafka.PublisherConfig{})
	msgs := []broker.Message{
		{ID: "a1", Topic: topic, Key: "a", Body: []byte("1")},
		{ID: "a2", Topic: topic, Key: "a", Body: []byte("2")},
	}
	var pe *broker.PublishError
	require.ErrorAs(t, pub.Publish(t.Context(), msgs), &pe)
	require.ErrorIs(t, pe.Failed[0], kerr.InvalidRecord)
	require.ErrorIs(t, pe.Failed[1], kafka.ErrEarlierFailed)
	require.Equal(t, map[int32]int64{0: 0}, c.ends(t, topic), "nothing was written")

	require.NoError(t, pub.Publish(t.Context(), msgs))
	require.Equal(t, map[int32]int64{0: 2}, c.ends(t, topic))
}
