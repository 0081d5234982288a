package memory_test

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
)

// Publish, receive, acknowledge. The second delivery is Nacked and comes
// back, ahead of the later message with its key; Attempt shows the
// redelivery.
func Example() {
	ctx := context.Background()
	b := memory.New(memory.Config{})
	defer b.Close()

	pub := b.Publisher()
	err := pub.Publish(ctx, []broker.Message{
		{ID: "evt-1", Topic: "invoices", Key: "acme", Body: []byte(`{"total":"10.00"}`)},
		{ID: "evt-2", Topic: "invoices", Key: "globex", Body: []byte(`{"total":"20.00"}`)},
		{ID: "evt-3", Topic: "invoices", Key: "globex", Body: []byte(`{"total":"30.00"}`)},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("confirmed:", b.Published("invoices"))

	c := b.Consumer("invoices")
	defer c.Close()
	for range 4 {
		d, err := c.Receive(ctx)
		if err != nil {
			panic(err)
		}
		m := d.Message()
		attempt := 0
		if md, ok := d.(*memory.Delivery); ok { // Attempt is the memory broker's own
			attempt = md.Attempt()
		}
		fmt.Printf("%s from %s, attempt %d: %s\n", m.ID, d.Source().Queue, attempt, m.Body)
		if m.ID == "evt-2" && attempt == 1 {
			err = d.Nack(ctx) // a transient failure: deliver it again
		} else {
			err = d.Ack(ctx)
		}
		if err != nil {
			panic(err)
		}
	}
	// Output:
	// confirmed: 3
	// evt-1 from invoices, attempt 1: {"total":"10.00"}
	// evt-2 from invoices, attempt 1: {"total":"20.00"}
	// evt-2 from invoices, attempt 2: {"total":"20.00"}
	// evt-3 from invoices, attempt 1: {"total":"30.00"}
}
