// Package broker is the broker-neutral contract through which llmq's outbox
// relay publishes events and its inbox ingress receives messages, so neither
// depends on a particular broker. Hosts pick an adapter that implements it
// (broker/memory here; broker/rabbitmq and broker/kafka).
//
// The contract is the Message every adapter carries, a Publisher that
// reports success only after the broker confirmed, and a Consumer whose
// Deliveries are acknowledged only after the receiver durably accepted them.
// Adapters implement it without extending it; one optional interface,
// LimitedDelivery, is part of the contract.
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
//   - Received messages keep what a Message can hold of the wire form, and
//     the rest is mapped the same way by every adapter: a null payload is a
//     nil Body and an empty one a non-nil empty Body (adapters whose broker
//     has no null payload never deliver nil); a null key and an empty key
//     are both ""; a null header value is ""; a header repeated on the
//     wire keeps its last value. A typed header value (AMQP's numbers,
//     timestamps, tables) is text that other clients can parse, as its
//     adapter documents: numbers in decimal, timestamps in RFC 3339,
//     tables and arrays as JSON. Ids, keys and headers are passed on as
//     received, whatever their bytes: judging them is the receiver's
//     business (package inbox quarantines what it cannot accept). The
//     dead-letter path receives the original, not the mapping.
//   - Publishing a nil Body sends an empty payload, never a null one, so a
//     message published and received through llmq has a non-nil Body.
//   - A broker that stops delivering a message handed back too often (a
//     RabbitMQ queue's delivery limit) says so: its deliveries are
//     LimitedDelivery values reporting their attempt against that limit,
//     so that a receiver can settle a message's last delivery itself
//     rather than let the broker drop or dead-letter it unseen.
//
// Decision: null and empty keys and header values, and repeated headers,
// are not told apart in Message. Doing so would change the type of Key or
// Headers for every user, for producers llmq does not control; the mapping
// is stated instead, and the inbox's quarantine and the dead-letter path
// keep what a receiver refused.
//
// What a broker guarantee is not: a publisher confirm means the broker has
// the message, not that anyone processed it; an ack means the receiver
// recorded it, not that a model was called once.
package broker
