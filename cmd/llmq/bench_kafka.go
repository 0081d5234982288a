package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
	"github.com/llmq/llmq/outbox"
)

// benchKafkaPartitions is the partition count of the bench's topics.
const benchKafkaPartitions = 6

// relayKafka writes -jobs outbox events and relays them to Kafka: an
// in-process kfake cluster, or the cluster of KAFKA_BROKERS, on topics of
// its own. First it
// measures the raw produce rate of the same number of messages of the same
// shape (id, key, the relay's headers, the same body), published by
// -workers goroutines in calls of -claim-batch messages through the same
// Publisher, so the two rates compare the relay's overhead (claiming and
// marking in Postgres) with the broker's own.
func (b *bench) relayKafka(ctx context.Context) (float64, error) {
	events, err := b.writeOutboxEvents(ctx, b.o.jobs)
	if err != nil {
		return 0, err
	}
	brokers, where, closeCluster, err := benchKafkaCluster()
	if err != nil {
		return 0, err
	}
	defer closeCluster()
	suffix := randomSuffix()
	rawTopic, relayTopic := "llmq-bench-raw-"+suffix, "llmq-bench-relay-"+suffix
	if err := createBenchTopics(ctx, brokers, rawTopic, relayTopic); err != nil {
		return 0, err
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		return 0, err
	}
	defer func() { _ = pub.Close() }()
	batch := cmp.Or(b.o.batch, 1000)

	raw, err := b.rawProduce(ctx, pub, rawTopic, batch)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(b.progress, "llmq bench: kafka (%s) raw produce: messages=%d publishers=%d batch=%d seconds=%.3f msgs_per_s=%.0f\n",
		where, b.o.jobs, b.o.workers, batch, raw, float64(b.o.jobs)/raw)

	elapsed, err := b.runRelays(ctx, events, renameTopic{Publisher: pub, topic: relayTopic})
	if err != nil {
		return 0, err
	}
	n, err := topicRecords(ctx, brokers, relayTopic)
	if err != nil {
		return 0, fmt.Errorf("llmq bench: counting the relayed events: %w", err)
	}
	if n < int64(b.o.jobs) {
		return 0, fmt.Errorf("llmq bench: kafka holds %d of %d relayed events", n, b.o.jobs)
	}
	fmt.Fprintf(b.progress, "llmq bench: kafka (%s) relay: events=%d relays=%d batch=%d seconds=%.3f events_per_s=%.0f (%.0f%% of the raw produce rate)\n",
		where, b.o.jobs, b.o.workers, batch, elapsed, float64(b.o.jobs)/elapsed, 100*raw/elapsed)
	return elapsed, nil
}

// rawProduce publishes -jobs messages shaped like the relay's to topic and
// returns the seconds it took.
func (b *bench) rawProduce(ctx context.Context, pub broker.Publisher, topic string, batch int) (float64, error) {
	msgs := make([]broker.Message, b.o.jobs)
	for i := range msgs {
		id := uuid.Must(uuid.NewV7()).String()
		msgs[i] = broker.Message{
			ID: id, Topic: topic, Key: strconv.Itoa(i % 1000),
			Headers: map[string]string{outbox.HeaderEventID: id, outbox.HeaderEventType: "bench.event"},
			Body:    json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`),
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, b.o.workers)
	start := time.Now()
	for range b.o.workers {
		wg.Go(func() {
			for {
				from := int(next.Add(int64(batch))) - batch
				if from >= len(msgs) {
					return
				}
				if err := pub.Publish(ctx, msgs[from:min(from+batch, len(msgs))]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	close(errs)
	return elapsed, <-errs
}

// renameTopic publishes every message to one topic: the bench's events
// name the topic "bench", and each run gets topics of its own.
type renameTopic struct {
	broker.Publisher
	topic string
}

func (r renameTopic) Publish(ctx context.Context, msgs []broker.Message) error {
	out := make([]broker.Message, len(msgs))
	for i, m := range msgs {
		m.Topic = r.topic
		out[i] = m
	}
	return r.Publisher.Publish(ctx, out)
}

// benchKafkaCluster returns the brokers of KAFKA_BROKERS, or of a kfake
// cluster it starts, and what to call it.
func benchKafkaCluster() (brokers []string, where string, closeCluster func(), err error) {
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		return strings.Split(env, ","), "KAFKA_BROKERS", func() {}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, "", nil, fmt.Errorf("starting kfake: %w", err)
	}
	return c.ListenAddrs(), "in-process kfake", c.Close, nil
}

func createBenchTopics(ctx context.Context, brokers []string, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	resps, err := kadm.NewClient(cl).CreateTopics(ctx, benchKafkaPartitions, -1, nil, topics...)
	if err != nil {
		return fmt.Errorf("creating the bench topics: %w", err)
	}
	return resps.Error()
}

// topicRecords counts the records in topic.
func topicRecords(ctx context.Context, brokers []string, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, ends.Error()
}
