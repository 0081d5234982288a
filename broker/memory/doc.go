// Package memory is an in-process broker: the broker contract kept in a
// mutex-guarded map, for tests and for llmq's embedded, broker-less default.
// Code tested against it should behave the same on RabbitMQ or Kafka, so it
// keeps the contract's promises, including the inconvenient ones such as
// redelivery, rather than the easy subset.
//
//	b := memory.New(memory.Config{})
//	defer b.Close()
//	err := b.Publisher().Publish(ctx, msgs)
//	d, err := b.Consumer("invoices").Receive(ctx)
//	err = d.Ack(ctx)
//
// # Guarantees
//
//   - Publish confirms synchronously: a nil error means every message is in
//     its topic's queue. Messages that fail validation (empty ID or Topic)
//     or Config.FailPublish are reported in a *broker.PublishError and not
//     enqueued; the others are. broker.ErrClosed or a context error means
//     none was enqueued. One call's messages enter their queues together, in
//     call order.
//   - Each topic has one queue, created on first use, that keeps messages
//     until they are acknowledged or rejected, as one durable RabbitMQ queue
//     bound to the topic would. Consumers of the same topic compete for it:
//     each message goes to one of them at a time.
//   - Delivery is at-least-once. A Nacked delivery is delivered again after
//     Config.RedeliveryDelay; the deliveries a consumer holds when it is
//     closed are delivered again at once, as after a dropped connection.
//     Every delivery reports its attempt number (Delivery.Attempt).
//   - Messages sharing a non-empty Key are delivered in publish order and
//     never two at a time: while one is delivered and unsettled, or waiting
//     out its redelivery delay, later messages with that key wait. A message
//     delivered again keeps its place ahead of them. Messages with other keys,
//     or none, flow past.
//   - Rejected messages go to the topic's dead-letter list (DeadLetters), in
//     rejection order, and are never delivered again.
//   - Ack, Nack and Reject take effect at once and, like RabbitMQ's, ignore
//     their context: a verdict given with an ended context still counts, so
//     a message is never left held, with its key's later messages waiting
//     behind it, until its consumer closes.
//   - Every method is safe for concurrent use. A blocked Receive returns as
//     soon as a message it may take is ready, its context ends, or its
//     consumer or the broker is closed; it never polls.
//
// # Differences from a real broker
//
//   - Nothing is persisted: everything, confirmed messages included, is lost
//     when the process exits. Use it for tests, and in deployments where the
//     outbox is the durable store and its relay republishes what was lost.
//   - A topic's queue exists from its first Publish or Consumer, so messages
//     published before anyone consumes are kept; a RabbitMQ exchange with no
//     bound queue would drop them.
//   - There are no partitions: per-key order is kept for every key at once,
//     as if each key had its own partition, and idle consumers never wait
//     behind a busy key of another.
//   - Messages are copied in and out (Headers and Body), so neither the
//     publisher nor a receiver can change what others, or a redelivery, see.
//     There is no null payload: a message published with a nil Body is
//     received with an empty one.
package memory
