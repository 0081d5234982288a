package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
)

// A publisher declares its topology on every connection, publishes with
// confirms and reports an unroutable message as that message's failure; a
// consumer acknowledges what it durably accepted.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "llmq.example." + rand.Text()[:8]
	topo := rabbitmq.Topology{
		Exchange: name,
		Queues:   []rabbitmq.Queue{{Name: name, Bindings: []string{"invoices.#"}, DeliveryLimit: 5}},
	}
	defer deleteTopology(topo)

	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{
		ConnConfig: rabbitmq.ConnConfig{URL: amqpURL(), Name: "example-publisher", Topology: &topo},
		Exchange:   name,
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	if err := pub.WaitConnected(ctx); err != nil {
		panic(err)
	}
	err = pub.Publish(ctx, []broker.Message{
		{ID: "inv-1", Topic: "invoices.created", Body: []byte(`{"total":42}`)},
		{ID: "inv-2", Topic: "nobody.listens", Body: []byte(`{"total":7}`)},
	})
	failures := broker.Failures(2, err)
	fmt.Println("inv-1 confirmed:", failures[0] == nil)
	fmt.Println("inv-2 unroutable:", errors.Is(failures[1], rabbitmq.ErrUnroutable))

	cons, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{
		ConnConfig:    rabbitmq.ConnConfig{URL: amqpURL(), Name: "example-consumer"},
		Queue:         name,
		DeliveryLimit: 5, // the queue's: its sixth delivery is its last, which the inbox quarantines if it fails
	})
	if err != nil {
		panic(err)
	}
	defer cons.Close()
	d, err := cons.Receive(ctx)
	if err != nil {
		panic(err)
	}
	// ... accept it in the inbox and commit, then:
	if err := d.Ack(ctx); err != nil {
		panic(err)
	}
	fmt.Println("received", d.Message().ID, string(d.Message().Body))
	// Output:
	// inv-1 confirmed: true
	// inv-2 unroutable: true
	// received inv-1 {"total":42}
}

func deleteTopology(topo rabbitmq.Topology) {
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	if err := topo.Delete(ch); err != nil {
		panic(err)
	}
}
