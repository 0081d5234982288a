// Package outbox is llmq's transactional outbox: events are written in the
// same transaction as the state change they describe, so an event exists if
// and only if that change committed.
//
// Store.Write inserts one event on the caller's transaction or connection.
// Nothing is published here; a relay (a later part of this package) claims
// unpublished rows, publishes them through a broker and marks them published
// only after the broker confirmed. Delivery is therefore at-least-once, and
// consumers deduplicate by event ID (see package inbox).
//
// Guarantees of this package today:
//   - Write validates the whole event before it touches the database, and
//     returns a *ValidationError naming the field otherwise; a rejected event
//     writes nothing and leaves the caller's transaction usable.
//   - Events get time-ordered UUIDv7 IDs unless the caller supplies one; the
//     ID is the broker message ID downstream, stable across republishing.
//   - Rows carry a write-order sequence, so events sharing a key can be
//     published in the order they were written.
//   - Write issues a NOTIFY on "<schema>_outbox", delivered on commit, so a
//     relay can wake without polling.
package outbox
