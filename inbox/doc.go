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
//     to one consumer, exactly one is New; the unique key decides, not a
//     read-then-write.
//   - The inbox row and the caller's work commit or roll back together: if
//     the work fails and the transaction rolls back, no row remains and the
//     redelivery is processed as new.
//   - The same id with a different payload is not processed: Accept writes a
//     quarantine row in the transaction and returns ErrDigestMismatch, which
//     callers should alert on. Commit that transaction (without the work) to
//     keep the quarantine row; the ingress loop does.
//   - Rows are kept for Config.Retention (default 7 days) and then pruned.
//     The retention must exceed the sender's whole retry window: a message
//     redelivered after its row was pruned is processed again.
//
// Decisions: the digest is the SHA-256 of the message body only (headers
// carry transport details such as trace context, which may differ between
// redeliveries of the same message). Quarantined payloads are stored
// truncated to MaxQuarantinePayload bytes.
//
// Ingress takes deliveries in batches (IngressConfig.MaxBatch, Linger):
// one transaction records the batch's ids in one statement and runs the
// handlers, then commits once and settles each delivery. If anything in it
// fails, it is rolled back and redone with a savepoint per message, so a bad
// message is nacked or rejected alone. A handler can therefore run in a
// transaction that rolls back and then again, as after any redelivery: its
// effects belong in tx.
//
// # Observability
//
// With IngressConfig.MeterProvider the ingress counts llmq.inbox.messages
// ({message}; consumer, result = accepted | duplicate | quarantined |
// failed) as it settles each delivery: failed ones are nacked and come
// back. Consumer names are configuration, so the label is bounded. With
// IngressConfig.TracerProvider each delivery gets a consumer span
// "process <topic>" continuing the trace in the message's headers (read by
// IngressConfig.Propagator, W3C traceparent/tracestate by default), with
// messaging.message.id, messaging.destination.name,
// messaging.consumer.group.name and llmq.inbox.result; the handler runs in
// it.
package inbox
