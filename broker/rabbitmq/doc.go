// Package rabbitmq connects llmq to RabbitMQ: the outbox relay publishes
// events to an exchange through it, and the inbox ingress consumes them from
// durable queues. Hosts that run RabbitMQ use it in place of broker/memory.
//
// It is an adapter (AMQP 0-9-1, on github.com/rabbitmq/amqp091-go): a
// broker.Publisher that reports success only for messages the broker
// confirmed and routed, a broker.Consumer whose deliveries are acknowledged
// only after the receiver's transaction committed, and a Topology helper
// that declares durable queues with dead-lettering. It implements the broker
// contract, deliveries included as broker.LimitedDelivery, without
// extending it.
//
//	topo := rabbitmq.Topology{Exchange: "llmq", Queues: []rabbitmq.Queue{{Name: "erp", Bindings: []string{"invoice.#"}}}}
//	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: rabbitmq.ConnConfig{Topology: &topo}, Exchange: "llmq"})
//	relay, err := events.NewRelay(pool, pub, outbox.RelayConfig{})
//
//	cons, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{Queue: "erp"})
//	ingress, err := inboxStore.NewIngress(pool, cons, inbox.IngressConfig{Consumer: "erp", Handler: apply})
//
// # Publisher guarantees
//
//   - The channel is in confirm mode; messages are persistent, mandatory,
//     with MessageId = Message.ID, Message.Topic as routing key on
//     PublisherConfig.Exchange, Message.Headers as AMQP headers and
//     Message.Key in the HeaderKey header (AMQP has no message key).
//   - Publish returns nil only when every message was confirmed (basic.ack)
//     and not returned. A message the broker returned (no queue bound for
//     its routing key: ErrUnroutable) is a failure even though its confirm
//     follows: RabbitMQ sends basic.return before basic.ack, and the
//     library delivers both from one reader goroutine in that order, so the
//     goroutine that reads the confirms drains the returns first and matches
//     them to their message by MessageId. A nack (ErrNacked, e.g. a queue at
//     its length limit with reject-publish), a connection or channel lost
//     before the confirm (ErrConnectionLost), and the context ending fail the
//     messages concerned, each in the *broker.PublishError; the others are
//     confirmed. Two messages with one id in flight on one channel cannot be
//     told apart by a return; the outbox never does that.
//   - At most PublisherConfig.Window messages are unconfirmed at once,
//     across concurrent Publish calls; a Publish waits for room within its
//     context. Every wait is bounded by the context or PublishTimeout.
//
// # Connection management
//
// amqp091-go's own recovery is left off. Each Publisher and Consumer has one
// connection (publishers and consumers are kept apart, so that the broker
// throttling a publishing connection never stalls acknowledgements) watched
// by a supervisor: it drains the connection's close and blocked
// notifications (buffered, read until closed), and when the connection or
// its channel closes it fails what was in flight, redials with full-jitter
// backoff (ConnConfig.Reconnect), re-declares ConnConfig.Topology, reopens
// the channel and re-enables confirms or QoS and consuming. While it is
// down, Publish fails at once with ErrNotConnected, and while the broker
// blocks the connection (a resource alarm) with ErrBlocked: nothing is
// sent, the outbox relay backs the events off and retries, nothing is lost.
// The connection carries ConnConfig.Name as its client-provided name.
//
// # Consumer guarantees
//
//   - Acknowledgement is manual. Prefetch bounds the unsettled deliveries of
//     the consumer: the ingress work in flight into the database, not model
//     concurrency (which the job runner and admission limit).
//   - Ack, Nack and Reject go to the channel that delivered the message. If
//     that channel closed, they fail with ErrConnectionLost and the broker
//     redelivers the message (the inbox makes that a no-op if it had been
//     committed). Receive skips deliveries of a closed channel.
//   - Reject does not requeue: the queue dead-letters the message to its
//     dead-letter exchange. AMQP carries no reason with it (the broker adds
//     an x-death header saying "rejected"); the reason is logged at debug
//     level, and the inbox quarantine row records it.
//   - Nack requeues after ConsumerConfig.RequeueDelay, measured by a timer so
//     nothing sleeps; the delivery keeps its prefetch slot meanwhile. A
//     consumer or connection closing requeues it at once.
//   - Receive is safe for concurrent callers, each delivery going to one.
//   - Messages from any AMQP client are read: message-id is Message.ID
//     ("" without one), the routing key Message.Topic, the HeaderKey header
//     Message.Key, other headers Message.Headers (each value as text, see
//     Header values), the body Message.Body (never nil: AMQP has no null
//     body). Nothing is judged here: package
//     inbox quarantines and rejects a message without message-id or with
//     an id or headers it refuses, so it is dead-lettered once instead of
//     requeued in a loop, and rejects a message whose handling failed
//     inbox.IngressConfig.MaxAttempts times.
//
// # Header values
//
// AMQP headers are typed; a Message's are text. Each received value (and
// the HeaderKey header's, which becomes Message.Key) is rendered so that
// a reader in any language can parse it:
//
//   - void (a null value): "";
//   - a string (long string) or byte array: its bytes, as received, valid
//     UTF-8 or not (package inbox quarantines what is not);
//   - a boolean: "true" or "false";
//   - an integer (signed or unsigned, 8 to 64 bits): decimal, "-7";
//   - a float (32 or 64 bits): the shortest decimal that reads back as the
//     same float, "0.1", "1e+21"; NaN and the infinities as "NaN", "+Inf"
//     and "-Inf" (RabbitMQ refuses to carry them, so only a message built
//     by hand can hold them);
//   - a timestamp (whole seconds): RFC 3339 in UTC, "2026-03-04T05:06:07Z";
//   - a decimal (Value·10^-Scale): exact decimal text, 12345 with scale 2
//     as "123.45", -5 with scale 3 as "-0.005";
//   - a table or an array: JSON. A table is an object with its keys in
//     byte order, an array an array. Inside them void is null, booleans
//     are true and false, integers, floats and decimals are JSON numbers
//     written as above (NaN and the infinities as the JSON strings "NaN",
//     "+Inf", "-Inf"), timestamps are RFC 3339 strings, and strings, byte
//     arrays and keys are JSON strings of their text when they are valid
//     UTF-8 and JSON strings of the base64 of their bytes (standard
//     alphabet, padded) when they are not. The broker's x-death header,
//     an array of tables, reads as [{"count":1,"exchange":"llmq",
//     "queue":"erp","reason":"rejected","routing-keys":["invoice.created"],
//     "time":"2026-03-04T05:06:07Z"}].
//
// Decisions: at the top level, strings and byte arrays are kept byte for
// byte, so that the inbox can refuse what is not text rather than receive
// a repaired copy. JSON cannot hold
// bytes that are not UTF-8, so inside tables and arrays such values become
// base64, as encoding/json writes []byte: a reader cannot tell a base64
// string from text by looking, and such values are rare in headers (a
// binary field inside a table). Decimals are numbers inside JSON because
// their text is a valid JSON number, exact however it is read.
//
// # Delivery limits
//
// A quorum queue with a delivery limit N (Queue.DeliveryLimit, an
// x-delivery-limit argument or a delivery-limit policy; RabbitMQ 4 sets 20
// on queues that set none) delivers a message at most N+1 times: handed
// back once more, by a Nack or by its consumer's channel closing first,
// it is dead-lettered (or dropped, without a dead-letter exchange) by the
// broker, with no word to the receiver. The count travels in the
// x-delivery-count header of each redelivery. (RabbitMQ 3 counts both
// kinds of return; later releases may leave some out, and their limit
// applies to the same count.)
//
// Each Delivery is a broker.LimitedDelivery: DeliveryAttempt reports the
// attempt (x-delivery-count+1) against the most deliveries the queue
// makes. The consumer must be told the limit (ConsumerConfig.DeliveryLimit,
// or the Topology that declares the queue); without either it takes the
// broker's default, 20 from RabbitMQ 4.0 on and none before, read from the
// server's properties on each connection. Package inbox uses this to
// quarantine a message whose last delivery failed, instead of nacking it
// into a dead-lettering it would not record; a Nack of a last delivery is
// logged as a warning.
//
// Decision: the consumer is told the limit rather than discovering it.
// AMQP 0-9-1 cannot read a queue's arguments or policies back, and the
// count alone does not say which delivery is the last. A limit set
// lower than the queue's only makes the ingress quarantine sooner; one set
// higher lets the broker dead-letter messages unrecorded, as before.
//
// # Topology trade-offs
//
// Queues are quorum queues by default: replicated, durable, and with
// x-dead-letter-strategy at-least-once the broker keeps a dead-lettered
// message in the source queue until the dead-letter queue confirmed it, so a
// rejected message is not lost in transit. RabbitMQ honours at-least-once
// only with x-overflow reject-publish, which the helper therefore always
// sets: a queue at Queue.MaxLength refuses new messages (the publisher sees
// a nack and the relay retries) instead of dropping the oldest. The price
// is memory and disk (messages awaiting dead-lettering stay in the source
// queue) and that a full queue pushes back on publishers. Queue.DeliveryLimit
// (x-delivery-limit) dead-letters a message redelivered too often, which
// ends a poison message's loop even when no receiver rejects it; RabbitMQ
// 3 has no limit by default, RabbitMQ 4 one of 20 (see Delivery limits).
//
// Classic queues (Queue.Type = Classic) are single-node and lighter, but
// their dead-lettering is at most once (a message can be lost between the
// queues if a node fails), they support no delivery limit, and a node loss
// makes them unavailable. Use them for disposable signals, not for the
// records an outbox relays.
//
// Each queue gets its own durable fanout dead-letter exchange and
// dead-letter queue (Name+".dlx", Name+".dlq" by default). Declaring an
// existing queue with other arguments fails; change arguments under a new
// name.
//
// # Ordering
//
// A queue delivers in publish order to a single consumer, but redeliveries,
// delayed requeues and several consumers or ingress batches in parallel
// reorder messages. Per-key order needs one consumer per queue (or a
// single-active-consumer queue) with IngressConfig.Concurrency 1.
package rabbitmq
