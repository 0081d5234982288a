package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// Publish three messages of one key, receive them through a consumer
// group, Nack the second once: it comes back, with the same offset, after
// NackDelay. The committed offset stays behind it until it is acked. The
// cluster is kfake, an in-process Kafka.
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "invoices", "invoices.dlq"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	err = pub.Publish(ctx, []broker.Message{
		{ID: "evt-1", Topic: "invoices", Key: "acme", Body: []byte(`{"total":"10.00"}`)},
		{ID: "evt-2", Topic: "invoices", Key: "acme", Body: []byte(`{"total":"20.00"}`)},
		{ID: "evt-3", Topic: "invoices", Key: "acme", Body: []byte(`{"total":"30.00"}`)},
	})
	if err != nil {
		panic(err)
	}

	c, err := kafka.NewConsumer(kafka.ConsumerConfig{
		Brokers: brokers, Group: "erp", Topics: []string{"invoices"},
		NackDelay: 100 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	for range 4 {
		d, err := c.Receive(ctx)
		if err != nil {
			panic(err)
		}
		m, src := d.Message(), d.Source()
		attempt := 0
		if kd, ok := d.(*kafka.Delivery); ok { // Attempt is this adapter's own
			attempt = kd.Attempt()
		}
		fmt.Printf("%s at %s/%d/%d, attempt %d: %s\n", m.ID, src.Topic, src.Partition, src.Offset, attempt, m.Body)
		if m.ID == "evt-2" && attempt == 1 {
			err = d.Nack(ctx) // a transient failure: deliver it again
		} else {
			err = d.Ack(ctx)
		}
		if err != nil {
			panic(err)
		}
	}
	if err := c.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Println("records not yet committed:", c.Stats().InFlight)
	// Output:
	// evt-1 at invoices/0/0, attempt 1: {"total":"10.00"}
	// evt-2 at invoices/0/1, attempt 1: {"total":"20.00"}
	// evt-3 at invoices/0/2, attempt 1: {"total":"30.00"}
	// evt-2 at invoices/0/1, attempt 2: {"total":"20.00"}
	// records not yet committed: 0
}
