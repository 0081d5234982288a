// Package broker is llmq's broker-neutral contract: the Message every
// adapter carries, a Publisher that reports success only after the broker
// confirmed, and a Consumer whose Deliveries are acknowledged only after the
// receiver durably accepted them. Adapters (broker/memory here;
// broker/rabbitmq and broker/kafka) implement it without extending it.
//
// Guarantees an adapter must keep:
//   - Publish returns nil only when the broker confirmed every message it
//     was given. A message it could not confirm is reported individually
//     (see PublishError); the others are confirmed. Nothing is reported as
//     confirmed that might not be.
//   - Delivery is at-least-once. A delivery neither acknowledged nor
//     rejected (the consumer crashed, the connection dropped) is delivered
//     again. Receivers deduplicate by Message.ID (package inbox does).
//   - Message.ID is stable: republishing the same event carries the same ID.
//   - Messages sharing a Key are delivered in publish order to a single
//     consumer at a time where the broker supports it (Kafka partitions,
//     RabbitMQ single-active-consumer queues); a broker that cannot says so
//     in its package documentation.
//
// What a broker guarantee is not: a publisher confirm means the broker has
// the message, not that anyone processed it; an ack means the receiver
// recorded it, not that a model was called once.
package broker
