// Package outbox is llmq's transactional outbox: events are written in the
// same transaction as the state change they describe, so an event exists if
// and only if that change committed.
//
// Store.Write inserts one event on the caller's transaction or connection.
// A Relay claims unpublished rows in bounded batches, publishes them through
// a broker.Publisher outside any transaction, and marks them published only
// after the broker confirmed. Delivery is therefore at-least-once, and
// consumers deduplicate by event ID (see package inbox).
//
// Guarantees:
//   - Write validates the whole event before it touches the database, and
//     returns a *ValidationError naming the field otherwise; a rejected event
//     writes nothing and leaves the caller's transaction usable.
//   - Events get time-ordered UUIDv7 IDs unless the caller supplies one; the
//     ID is the broker message ID downstream, stable across republishing.
//   - Rows carry a write-order sequence, so events sharing a key can be
//     published in the order they were written.
//   - Write issues a NOTIFY on "<schema>_outbox", delivered on commit, so a
//     relay can wake without polling (it also wakes on the job store's
//     enqueue channel, and polls as a fallback).
//   - A relay's claim holds its events for ClaimLease; a relay that dies is
//     replaced when the lease runs out. Only confirmed events are marked
//     published; an event the broker did not confirm backs off (full jitter)
//     on its own, without holding back events of other keys.
//   - Events sharing a key are published in write order, even with several
//     relays and through failed publications: only the oldest unpublished
//     event of a key is ever claimed, so a key has one event in flight at a
//     time and a refused event holds back the later events of its key (and
//     only those) until it is published. Write order is commit order when
//     the writers of a key serialise on a lock, as a job's transitions do on
//     its row; writers of one key that do not are not ordered. Keys are for
//     ordering: a key carries one event per claim, so make keys as narrow
//     as the order needed (the job store keys events by job).
//   - The event id travels as the message id and in the llmq-event-id
//     header, with llmq-event-type and llmq-aggregate-id; the event's own
//     headers (trace context) are carried as they are.
//   - Relay.Stats reports the publication lag (age of the oldest unpublished
//     event) and the backlog; Prune deletes events published longer than
//     Retention ago.
//
// Relay.Run and Relay.Drain overlap the database with the broker: while one
// batch is being published, the next is claimed, in the same transaction
// that records the verdict on the batch before it. Key order is unaffected
// (a key whose event is in flight has nothing claimable), so this pays when
// batches hold different keys; when the batch in flight holds every key with
// events waiting, the overlapping claim finds nothing (it looks only two
// batches' worth of seqs ahead, so that costs little) and the next 32 claims
// wait for their batch to be published. RelayOnce relays one batch, one
// step after the other.
//
// Decisions: claims are serialised by a transaction-scoped advisory lock
// (one short statement each), because the key-order check must see every
// other relay's committed claims. A relay that crashes after the broker
// confirmed but before it recorded that republishes the event after its
// claim lease: duplicates happen only around crashes and lost connections.
//
// # Observability
//
// Write adds the trace context of its context's span to an event's headers
// when they carry none (Config.Propagator, W3C traceparent/tracestate by
// default). With RelayConfig.MeterProvider the relay reports
// llmq.outbox.events ({event}; result = published | failed: its rate is the
// publish rate), llmq.outbox.publish.duration (s; one batch until the
// broker confirmed), and, while Run runs, the observable gauges
// llmq.outbox.pending ({event}) and llmq.outbox.lag (s; age of the oldest
// unpublished event), read through outbox_pending_idx at most once per
// RelayConfig.GaugeRefresh (default 15s): the count reads one index entry
// per unpublished event, the age one entry. With RelayConfig.TracerProvider
// each event that carries a trace context is published in a producer span
// "publish <topic>", a child of the writer's span, whose context replaces
// the writer's in the message headers so consumers continue the trace
// through it; events written outside a trace get no span.
package outbox
