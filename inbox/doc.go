// Package inbox is llmq's durable inbox: a receiver records each message id
// it accepts in the same transaction as the work the message causes, so a
// redelivered message is recognised and does nothing the second time.
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		res, err := store.Accept(ctx, tx, "erp-sync", msg, delivery.Source())
//		if err != nil || res == inbox.Duplicate {
//			return err // a duplicate: nothing to do
//		}
//		return applyToERP(ctx, tx, msg) // commits together with the inbox row
//	})
//	// ack the delivery only after the commit
//
// Guarantees:
//   - Of any number of concurrent or repeated deliveries of one message id
//     to one consumer, exactly one is NewMessage; the unique key decides, not a
//     read-then-write.
//   - The inbox row and the caller's work commit or roll back together: if
//     the work fails and the transaction rolls back, no row remains and the
//     redelivery is processed as new.
//   - The same id with a different payload is not processed: Accept writes a
//     quarantine row in the transaction and returns ErrDigestMismatch, which
//     callers should alert on. Commit that transaction (without the work) to
//     keep the quarantine row; the ingress loop does.
//   - Rows are kept for Config.Retention (default 7 days) and then pruned
//     (Store.Prune, or a Pruner batch by batch, as the retention package's
//     service does).
//     The retention must exceed the sender's whole retry window: a message
//     redelivered after its row was pruned is processed again.
//   - A quarantine row holds anything a broker can deliver, as received:
//     the id's and headers' bytes (raw_message_id, raw_header_keys,
//     raw_header_values; message_id and headers show what text can), and
//     a null body (payload NULL) distinct from an empty one. Quarantined
//     payloads are truncated to MaxQuarantinePayload bytes.
//
// Decisions: the digest is the SHA-256 of the message body only (headers
// carry transport details such as trace context, which may differ between
// redeliveries of the same message).
//
// # Ingress
//
// Ingress takes deliveries in batches (IngressConfig.MaxBatch, Linger):
// one transaction records the batch's ids in one statement and runs the
// handlers, then commits once and settles each delivery. If anything in it
// fails, it is rolled back and redone with a savepoint per message, so a bad
// message is nacked or rejected alone; if that commit fails for a reason
// of its own (a deferred constraint), each message is redone in its own
// transaction. A handler can therefore run in a transaction that rolls back
// and then again, as after any redelivery: its effects belong in tx. A
// handler that fails because the ingress is stopping (its context ended
// between two of its statements) has its savepoint rolled back all the
// same, so no part of its work commits; should a savepoint fail to roll
// back for a reason of the database's (the connection lost), its whole
// batch is rolled back and nacked, uncounted. A handler that leaves its
// savepoint unusable itself, typically by ignoring the error of one of its
// statements (which aborts the transaction) and returning nil, is a bug of
// that handler: the batch is rolled back and redone without running that
// handler again, its delivery failing as a handler error does (below), and
// an error is logged. Each delivery is settled within a deadline of its
// own (10s), so a slow settle (a Kafka Reject's dead-letter produce)
// cannot leave the next to be settled with an ended context.
//
// A bad message harms only itself:
//   - What can never be accepted is quarantined and rejected (to the
//     broker's dead-letter path) at once, never retried: a message without
//     an id or with one Accept refuses (control characters, invalid UTF-8,
//     more than MaxMessageIDLen bytes), a null body (a Kafka tombstone, by
//     default: see Tombstones below), a header key or value that is not valid UTF-8 or contains NUL, an id
//     reused with another payload, and a handler error that is
//     ErrMalformed or a *llmqtype.ValidationError.
//   - Only failures known to be transient are retried without limit (by
//     the ingress; a broker's delivery limit is another matter, below):
//     ErrTransient (wrap a handler's error with Transient), the database
//     unreachable or shutting down, serialization failures, deadlocks,
//     lock timeouts, a network peer unreachable, and failures of the
//     inbox's own statements. A database outage therefore never
//     quarantines anything, but for a message on the last delivery a
//     broker's delivery limit allows (below).
//   - Any other handler failure, a panic or a savepoint the handler left
//     unusable included, is counted by message id, once per delivery,
//     when the delivery is settled (a handling redone
//     after a failed commit is not counted twice, one that never committed
//     for a transient reason not at all); at IngressConfig.MaxAttempts
//     failures (default 20) the message is
//     quarantined and rejected with ErrTooManyAttempts, so a poison nobody
//     foresaw cannot block a Kafka partition or a RabbitMQ queue for good.
//     The count lives in the ingress's memory: it starts again after a
//     restart, and each process counts its own. A handler that calls a
//     service which may be down longer than MaxAttempts redeliveries
//     (Kafka's NackDelay, RabbitMQ's RequeueDelay, 1s each by default)
//     should wrap those failures with Transient.
//   - No message leaves a broker with a delivery limit unrecorded. Such a
//     broker (a RabbitMQ quorum queue with x-delivery-limit, or RabbitMQ
//     4's default of 20) ends a message handed back on its last delivery,
//     with no word to the receiver; its deliveries say which is the last
//     (broker.LimitedDelivery). A failure there, of any kind, transient
//     ones and the batch's own included, quarantines and rejects the
//     message with ErrDeliveryLimit and logs an error, instead of nacking
//     it. If even the quarantine row cannot be written (the database
//     down), the delivery is nacked, the broker dead-letters it, and an
//     error naming it is logged. So on such a queue a transient failure is
//     retried only as many times as the limit allows: size the limit to
//     outlast the outages handlers should wait out (limit × RabbitMQ's
//     RequeueDelay, at least), or lift it, and tell the consumer what it
//     is (rabbitmq.ConsumerConfig.DeliveryLimit).
//   - A message is quarantined once. If its Reject fails (a dead-letter
//     produce that failed), the redelivery is rejected again without a
//     second row, in the same process; one delivered again after a crash
//     between the quarantine's commit and the reject is quarantined again,
//     as is a RabbitMQ message without message-id whose Reject failed.
//
// Decisions where the issue was silent: failures are counted by the
// ingress, not read from the broker, because RabbitMQ's classic queues
// have no delivery count and Kafka has none at all, and because only the
// ingress knows which nacks were the message's fault: a count of
// deliveries would quarantine everything in flight after a database
// outage. Timeouts (a statement timeout, a handler's own deadline) count,
// since a message can make its own handling slow; so does every error not
// known to be transient, as River and Oban retry any error up to a limit.
// The inbox's own statements never count: their failure says nothing about
// the message. A broker's delivery count is read only to know which
// delivery is the last: the ingress quarantines it there because a
// dead-letter queue keeps the message without its reason, outside the
// inbox where its other refusals are explained, and because a broker
// that drops instead (no dead-letter exchange) keeps nothing at all.
//
// # Tombstones
//
// A Kafka record with a null value, a tombstone, is how change-data-capture
// producers (Debezium and the like) mark a deleted row, so that compaction
// can drop its key; such topics hold one after each deletion. It is a
// message with a nil Body, and IngressConfig.Tombstones says what becomes
// of it:
//   - QuarantineTombstones (the zero value): quarantined and rejected to
//     the dead-letter topic, byte for byte, as a message that can never be
//     accepted.
//   - SkipTombstones: acknowledged without a transaction, so the
//     partition's commit moves past it; nothing is written and the
//     handler is not called. Each is counted as skipped and logged at
//     debug level with its topic, partition and offset. With or without an
//     id, whatever its headers: a skipped message is not judged.
//   - HandleTombstones: handled as any message, Body nil. It needs an id
//     (one without is quarantined), is recorded in the inbox, so a
//     redelivery is a duplicate, and its failures are retried, counted and
//     quarantined as any message's. Its payload digest is the empty
//     payload's: a tombstone and an empty message of one id are the same
//     message.
//
// Decision: skipped tombstones leave no row. Most carry no id to record
// them under (change-data-capture producers write none), a record's
// position is no id
// (offsets are reused when a topic is recreated), and a row per deletion
// would cost a write for a message the host declared it does not need.
// What explains a skip is the metric, the debug line and the committed
// offset, which passes it only once every record before it was settled.
//
// Connections: an ingress holds no database connection while it waits for
// deliveries and uses at most IngressConfig.Concurrency connections (default
// 1), one per batch in flight, however many goroutines call Run or Handle
// and however many deliveries the consumer has in flight (Kafka's
// MaxInFlight, RabbitMQ's Prefetch). Size the pool for that plus what the
// handlers open themselves.
//
// Logging: with no IngressConfig.Logger the ingress logs through
// slog.Default(): a warning for each delivery nacked and each failed
// receive, an error for each message quarantined, each handler panic,
// each handler that left its savepoint unusable, and each message a
// broker's delivery limit ended without a quarantine row.
// Nothing is logged for deliveries accepted.
//
// # Observability
//
// With IngressConfig.MeterProvider the ingress counts llmq.inbox.messages
// ({message}; consumer, result = accepted | duplicate | quarantined |
// failed | skipped) as it settles each delivery: failed ones are nacked
// and come back, skipped ones are tombstones acknowledged unhandled. Consumer names are configuration, so the label is bounded. With
// IngressConfig.TracerProvider each delivery gets a consumer span
// "process <topic>" continuing the trace in the message's headers (read by
// IngressConfig.Propagator, W3C traceparent/tracestate by default), with
// messaging.message.id, messaging.destination.name,
// messaging.consumer.group.name and llmq.inbox.result; the handler runs in
// it.
package inbox
