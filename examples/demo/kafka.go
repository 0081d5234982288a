package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// kafkaSignals returns a publisher and a consumer of the job events on a
// Kafka topic of this run's own (so that a real cluster's earlier runs are
// never read back), and what to close when done. The brokers are
// KAFKA_BROKERS, or else an in-process kfake cluster, a real Kafka
// wire-protocol broker.
func kafkaSignals(ctx context.Context, eventTopic string) (broker.Publisher, broker.Consumer, func(), error) {
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	closeCluster := func() {}
	if brokers[0] == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("starting kfake: %w", err)
		}
		brokers, closeCluster = c.ListenAddrs(), c.Close
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	topic := "llmq.demo." + hex.EncodeToString(suffix)
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		closeCluster()
		return nil, nil, nil, err
	}
	adm := kadm.NewClient(admin)
	deleteTopics := func() {
		_, _ = adm.DeleteTopics(context.WithoutCancel(ctx), topic, topic+".dlq")
		admin.Close()
	}
	// Three partitions: job events are keyed by job id, so each job's
	// events keep their order while different jobs spread out.
	resp, err := adm.CreateTopics(ctx, 3, -1, nil, topic, topic+".dlq")
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		deleteTopics()
		closeCluster()
		return nil, nil, nil, fmt.Errorf("creating the kafka topics: %w", err)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		deleteTopics()
		closeCluster()
		return nil, nil, nil, err
	}
	// The consumer lives until cleanup closes it, not as long as ctx.
	cons, err := kafka.NewConsumer(kafka.ConsumerConfig{Brokers: brokers, Group: topic, Topics: []string{topic}}) //nolint:contextcheck // its life ends at Close, not with ctx
	if err != nil {
		_ = pub.Close()
		deleteTopics()
		closeCluster()
		return nil, nil, nil, err
	}
	cleanup := func() { //nolint:contextcheck // runs at shutdown; Close bounds its own commit with CommitTimeout
		_ = cons.Close()
		_ = pub.Close()
		deleteTopics()
		closeCluster()
	}
	return toTopic{Publisher: pub, from: eventTopic, to: topic}, cons, cleanup, nil
}

// toTopic publishes the job events (the store's event topic) to this run's
// Kafka topic.
type toTopic struct {
	broker.Publisher
	from, to string
}

func (p toTopic) Publish(ctx context.Context, msgs []broker.Message) error {
	out := make([]broker.Message, len(msgs))
	for i, m := range msgs {
		if m.Topic == p.from {
			m.Topic = p.to
		}
		out[i] = m
	}
	return p.Publisher.Publish(ctx, out)
}
