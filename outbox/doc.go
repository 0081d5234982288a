// Package outbox is llmq's transactional outbox: events are written in the
// same transaction as the state change they describe, so an event exists if
// and only if that change committed.
//
// Store.Write inserts one event on the caller's transaction or connection;
// Store.WriteBatch inserts many as one batch row (see "Batch rows" below).
// A Relay claims unpublished rows in bounded batches, publishes them through
// a broker.Publisher outside any transaction, and marks them published only
// after the broker confirmed. Delivery is therefore at-least-once, and
// consumers deduplicate by event ID (see package inbox).
//
// Guarantees:
//   - Write validates the whole event before it touches the database, and
//     returns a *llmqtype.ValidationError naming the field otherwise; a rejected event
//     writes nothing and leaves the caller's transaction usable.
//   - Events get time-ordered UUIDv7 IDs unless the caller supplies one; the
//     ID is the broker message ID downstream, stable across republishing.
//   - Rows carry a write-order sequence, so events sharing a key can be
//     published in the order they were written.
//   - Write issues a NOTIFY on "<schema>_outbox", delivered on commit, so a
//     relay can wake without polling (it also wakes on the job store's
//     enqueue channel, and polls as a fallback).
//   - Any number of relays may Run on one outbox (one per pod): one, the
//     active relay, holds the leader lease and publishes; the others stand
//     by (see "Relays in every pod" below). When the active relay dies, a
//     standby takes over within LeaderLease + StandbyPoll (at most twice
//     LeaderLease) and releases the dead relay's claims, so its batch is
//     published again at once rather than after ClaimLease.
//   - A relay's claim holds its events for ClaimLease; a claim of a relay
//     that dies is released by the next active relay, or runs out. Only
//     confirmed events are marked published; an event the broker did not
//     confirm backs off (full jitter) on its own, without holding back
//     events of other keys.
//   - A database restart or a lost connection costs the active relay no
//     claim lease: it records what the broker confirmed meanwhile once the
//     database is back, releases its own claims that nothing is publishing,
//     and resumes publication within about a second of the database's
//     return (see "Lost connections" below).
//   - Events sharing a key are published in write order, even with several
//     relays and through failed publications: only the oldest unpublished
//     event of a key is ever claimed, so a key has one event in flight at a
//     time and a refused event holds back the later events of its key (and
//     only those) until it is published. The check reads a 64-bit hash of
//     the key (migration 0019, a narrower index entry per event): two keys
//     sharing a hash, about one pair in 2^64, hold each other back, which
//     delays and never reorders. Write order is commit order when
//     the writers of a key serialise on a lock, as a job's transitions do on
//     its row; writers of one key that do not are not ordered. Keys are for
//     ordering: a key carries one event per claim, so make keys as narrow
//     as the order needed (the job store keys events by job).
//   - The event id travels as the message id and in the llmq-event-id
//     header, with llmq-event-type and llmq-aggregate-id; the event's own
//     headers (trace context) are carried as they are.
//   - Relay.Stats reports the publication lag (age of the oldest unpublished
//     event) and the backlog; Prune deletes events published longer than
//     Retention ago (with RelayConfig.DeletePublished, events are deleted
//     as soon as they are confirmed). A Pruner runs the same statement without a relay (the
//     retention package's service uses it), and can delete unpublished
//     events on a host that runs no relay, never while a relay holds the
//     leader lease.
//
// # Storage
//
// An event is one row of the outbox table. A relay's claim updates the
// row (claimed_by, claimed_until, attempts: heap-only on the half-filled
// pages of migration 0007, and without a row lock before it, which would
// be a WAL record of its own) and its publication marks it (published_at),
// which moves the row, since published_at is in every index's predicate;
// the pruner deletes it Retention later. Without the row lock, a claim
// would wait for any session holding an event's row; it waits 200ms at
// most, and when some session holds one longer (an operator's open
// transaction), the relay's claims skip locked rows for a minute, with
// the lock, as they always did: a held event holds back only itself and
// the later events of its key. The verdicts do the same: one on a held
// event is kept by the relay and recorded by a later transaction once the
// row is free (so the event is not published again unless the relay
// stops, or its claim passes to another relay, first), and a takeover
// releases the previous holder's claims except those on held rows, which
// become claimable when their claim runs out. No statement of a relay
// waits long for a row while it holds the claims' lock.
// RelayConfig.DeletePublished deletes the row at publication instead, and
// keeps no history of published events. Bytes of WAL per event
// (BenchmarkEventWAL, PostgreSQL 15; docs/performance.md): written 695;
// kept, 408 to relay and 544 to prune a day later; deleted at
// publication, 221 in all, and the one relay of the benchmark published
// about 1.2× as many events a second.
//
// The verdicts plan with sequential scans off. A connection keeps a
// statement's plan until the table's statistics change, and a verdict
// planned on an outbox of a few rows (DeletePublished, with events
// trickling in) scanned the table for every batch while a burst filled it,
// until autovacuum analyzed it (for ever on a server without autovacuum).
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
// # Round trips
//
// Each claim is one round trip to the database: the claims' lock, the
// verdict on the batch before it and the claim are sent together, as one
// batch of statements that PostgreSQL runs as one implicit transaction
// (it commits at the batch's end, or rolls back whole at its first error),
// without a BEGIN or COMMIT of their own; so is a verdict recorded on its
// own. Where the relay, the database and the broker share a few cores,
// every round trip is one more wait for a core on both sides, and a BEGIN
// and a COMMIT of their own would make three of each claim. A claim whose
// reply does not reach the relay (its context ended, its connection
// failed) may have committed, as a COMMIT whose reply was lost may have:
// its events stay claimed until the relay or a takeover releases them
// (Lost connections) or ClaimLease runs out.
//
// # Batch rows
//
// Store.WriteBatch writes the events of one call as one row of
// outbox_batches (migration 0021): one heap row, one entry per index, and
// one claim and one publication update for all of them, where single-event
// rows cost all of that per event. A row of tens of events costs about 110
// bytes of WAL per event to write, against about 650, and next to nothing
// to relay, against about 1,150 (docs/performance.md). Each event keeps
// its own ID and its own seq from the outbox's sequence, so both tables
// share one write order; a batch's events are in the order given.
//
// Guarantees and rules, beside those above:
//   - The relay claims batch rows in write order, the unpublished rows
//     with the lowest seqs, beside its single-event rows: a claim takes up
//     to BatchSize single-event rows and then the first batch rows while
//     they are due and hold at most BatchSize events together (the first
//     whatever its size; it is published in parts of BatchSize messages).
//     A batch row in flight holds the batch rows after it, and a keyed
//     single-event row is claimed only while no batch row below it is
//     unpublished. So a key's events in two batch rows, or in a batch row
//     and a later single-event row, are published in write order.
//   - A batch row is published whole and never backs off. An event the
//     broker refuses is split out: copied into a single-event row, with its
//     seq, ID, creation time and headers, which backs off and is retried as
//     any other; so is an event held back by an earlier unpublished
//     single-event row of its key, and every later event of a key whose
//     earlier event in the row was split. The copies are made in the
//     transaction that marks the row published, only while the claim is
//     still the relay's, so no event is ever both copied and publishable
//     from its row, and each is split at most once. Within a row, a key's
//     later event is published only after its earlier one was confirmed
//     (the row is published in waves, one event per key each).
//   - A batch row claimed before and never settled (its relay died, or its
//     publication hung past ClaimLease) is split whole by the next claim,
//     unpublished: a row that stops its publisher every time then holds
//     only its keys, not every keyed event after it. BatchResult.Deferred
//     counts events split unpublished.
//   - What a batch row costs the relay is that a stuck row holds back every
//     keyed event written after it until it is settled or split: a row
//     another session holds locked (an operator's open transaction) is not
//     claimed while held (a claim waits at most 200ms for it, and then the
//     relay skips locked rows for a minute, as for single-event rows), and
//     the rows after it wait with it.
//   - Event IDs identify events. A copy whose ID a stored event already
//     has is not made: a consumer deduplicating by ID would drop it anyway.
//     WriteBatch refuses a batch that holds one ID twice.
//   - Events of concurrent writers are not ordered, as for single-event
//     rows: two batch rows written at once may interleave their seqs, and
//     their events of one key may be published in either order.
//   - Readers see each event once: ListByAggregate, Stats, the Pruner's
//     counts and Prune read both tables, and count an event split out of
//     its row by its copy. Published batch rows are pruned after Retention
//     (deleted at publication with DeletePublished).
//   - Relays of builds from before migration 0021 know nothing of batch
//     rows; the migration renames the leader lease's epoch column so that
//     every statement of such a relay fails, and only relays of this build
//     publish once it ran. An old relay holding the lease when the
//     migration runs can neither claim nor renew, so it stands down when
//     its lease runs out and a relay of this build takes over: publication
//     pauses for up to about twice LeaderLease, and events wait, none lost
//     or reordered. Old relays stay standbys (their attempts to take the
//     lease fail) until they are replaced. Migrating down copies the
//     events still waiting in batch rows into single-event rows.
//
// Code that reads the outbox in SQL (a change feed, a report) reads both
// tables. A batch row's events column is a json array (json text, not
// jsonb, since migration 0022: building it with json_agg costs a quarter
// of jsonb_agg's time) of objects with seq, id, topic, type, payload,
// aggregate and key (JSON null when the event has none), and headers when
// the event has any; split lists the seqs of the events read from their
// copies instead. outbox_batches_last_seq_idx finds the rows holding
// events above a seq, outbox_batches_created_idx those written in a time
// range. Every event, once:
//
//	SELECT event_id, aggregate_id, topic, key, event_type, payload, seq, published_at
//	FROM llmq.outbox
//	UNION ALL
//	SELECT (e->>'id')::uuid, (e->>'aggregate')::uuid, e->>'topic', e->>'key', e->>'type',
//	    (e->'payload')::jsonb, (e->>'seq')::bigint, b.published_at
//	FROM llmq.outbox_batches AS b, json_array_elements(b.events) AS e
//	WHERE (e->>'seq')::bigint <> ALL (b.split)
//
// # Relays in every pod
//
// Run takes a leader lease (one row, outbox_relay_lease) before it claims:
// the relay holding it is the active one and relays exactly as a lone
// relay does; every other relay stands by. So any number of relays on one
// outbox publish as fast as one, and hold the connections of one plus
// nothing per standby. The active relay renews the lease every third of
// RelayConfig.LeaderLease (default 10s); a standby reads the lease row
// when the lease it last saw would expire without a renewal, but never
// waits longer than RelayConfig.StandbyPoll (default LeaderLease/2) nor,
// with its jitter of up to an eighth, less than 7/16 of it between two
// checks, and takes the lease over once it is free:
// released by a relay whose Run ended (taken at the next check), or not
// renewed for LeaderLease (the holder died, froze, or lost the database). A relay that cannot renew for a whole
// lease stands down by itself. Relay.Active and the
// llmq.outbox.relay.active gauge say which relay is publishing.
//
// Fencing. Each acquisition increments the lease's epoch, and the active
// relay's claims carry the epoch it acquired: a claim succeeds only while
// the lease row still names its relay with that epoch, checked in the
// claim's statement under the claims' lock, which the takeover also takes.
// A relay that was paused (SIGSTOP, a long GC or VM pause) past its lease
// and then resumes therefore claims nothing more: its next claim finds the
// new epoch and returns empty, and its renewal finds the row taken and
// makes it stand by. What it had in flight when it paused is handled by
// the takeover, which releases the previous holder's claims: the new
// active relay publishes those events again, in key order (each was the
// oldest unpublished event of its key, so no later event of the key is
// claimable before it is confirmed and marked). The resumed relay may
// still hand its old batch to the broker: those messages are duplicates of
// events already delivered, arriving late, which consumers drop by event
// id (package inbox); the first delivery of every event is in key order.
// Its verdicts count for nothing (MarkPublished and MarkFailed require its
// claim, which was released), so it never marks an event the new relay is
// publishing. Relay IDs must therefore be unique (the default is). A
// relay frozen inside a transaction holding the claims' lock would stop
// the takeover with it. A claim's transaction (and a verdict's of its own)
// is sent whole, and the server runs it to its commit without waiting for
// the relay between statements (see Round trips): only a relay frozen
// while its batch is half sent, or with results unread filling the
// connection's buffers, holds the lock there. The takeover's transaction,
// whose statements a standby sends one after another, sets
// idle_in_transaction_session_timeout to half the lease, so Postgres ends
// a session frozen between them, rolls it back and frees the lock in time.
//
// Why a leader and not key-hash partitions shared among relays: one relay
// already keeps the claim path busy (claims are serialised by the claims'
// lock, and batches overlap publishing), so partitions would add claims
// that wait for the same lock, a rebalancing protocol, and a partition
// scan per claim, for no more throughput than one relay; and every pod's
// relay would hold connections. A leader adds one statement per renewal
// and costs nothing on the claim path (a one-time filter on one row). The
// price is a failover time of up to LeaderLease + StandbyPoll after a crash
// (a clean stop hands over at the next check), and a relay restarted after
// SIGKILL waits that long too.
//
// RelayOnce and Drain take no lease: they claim beside whichever relay is
// active, which keeps key order (the claim rules hold across relays) but
// adds no speed. They are for callers driving a relay themselves.
//
// # Lost connections
//
// A transaction of the active relay that fails for the connection's or
// the server's trouble (a restart, a failover, a reset connection, a
// timeout, a pooler's prepared-statement errors: SQLSTATE class 08,
// 57P01 to 57P03, 26000, 42P05) may leave two things behind that would
// hold events for ClaimLease, and every later event of their keys and
// every batch row after them with them: the broker's verdict on a batch
// it published, which the failed transaction was recording, and a claim
// whose commit reached the server while its reply did not. Run deals with
// both, and tries a failed pass again within a second (backoff from 50ms
// to 1s), so publication resumes within about a second of the database's
// return:
//   - A verdict a lost connection failed is kept, as a verdict on a row
//     another session holds is, and recorded first by the relay's next
//     transaction, while the claims are still its own: what the broker
//     confirmed is not published again. A verdict the database refused
//     for what it holds is dropped: its events are published again once
//     their claims run out.
//   - The first claim after such a failure releases the relay's own
//     claims (ReleaseOwnClaims), in the claims' lock, after the kept
//     verdicts and before it claims. Only then: a failed pass ends only
//     once the batch it was publishing has returned, and the next pass
//     starts with nothing in flight, so every claim the relay still has is
//     one nothing is publishing. A released claim is undone, its attempt
//     count too (the relay knows its publication returned, so a batch row
//     claimed again is published whole, not split out as a row whose
//     publication stopped its relay), and its events are claimed again in
//     key order, as after a takeover: each was the oldest unpublished
//     event of its key, or its row the first unpublished batch row. Those
//     of a lost reply were never handed to the broker; those of a dropped
//     verdict are published a second time, which at-least-once delivery
//     allows.
//   - A database away for a whole LeaderLease makes the relay stand down
//     (it cannot renew); whichever relay takes the lease next, itself
//     included, releases the claims as after any takeover.
//   - RelayOnce and Drain keep a verdict the same way but release nothing:
//     they take no lease and may be driven beside Run, so their claims run
//     out after ClaimLease.
//
// Decision: the relay releases its own claims after a failed pass rather
// than treating them as claimable in every claim, because its claims
// overlap publication (the next batch is claimed while one is in flight)
// and a claim cannot tell a batch in flight from a lost one; after a
// failed pass the relay knows there is none. The release is not fenced by
// the leader epoch: it touches only claims made under this relay's ID,
// which is unique, and no other relay publishes those (a takeover
// releases them first). A failure that is not the connection's (a
// statement the database refused) releases nothing, as before, so a row
// that makes a statement fail cannot make the relay publish it again on
// every pass.
//
// # Connections
//
// The active relay holds one dedicated connection for LISTEN (opened from
// the pool's configuration, outside the pool; none with
// RelayConfig.DisableListen) and uses the pool for one
// statement or transaction at a time: its claims and verdicts, pruning,
// and the lease renewal beside them, so at most two pool connections at
// once, plus one while the backlog gauges are read (MeterProvider only):
// at most four connections in all, usually two. A standby holds no
// connection: it borrows one pool connection for one statement per check
// (two, in one transaction, when the lease is free), and
// neither listens nor prunes nor reads the gauges. Whether an idle pool
// connection stays open between uses is the pool's setting
// (pgxpool.Config.MaxConnIdleTime).
//
// # Connection poolers
//
// Every statement the relay and the store run is whole in one transaction:
// no session setting outlives it (settings are set_config(..., true)), the
// claims' advisory lock is transaction-scoped, and nothing relies on a
// prepared statement or a temporary table kept from one transaction to
// the next. So the relay works on a pool that reaches PostgreSQL through
// PgBouncer in transaction pooling mode, in pgx's exec, simple-protocol
// and cache-describe query exec modes (and in its default mode where the
// pooler keeps prepared statements, PgBouncer 1.21 or later with
// max_prepared_statements). What such a pooler cannot carry is LISTEN: a
// notification reaches whichever client holds the server connection at
// that moment, or nobody. Set RelayConfig.DisableListen there; the relay
// then polls every PollInterval (500ms by default), so an event waits for
// at most that long, plus the claim, before it is published. docs/
// operations.md ("Connection poolers") says how to choose the mode.
//
// # Logging
//
// Warnings (events the broker refused, a failed pass, a lost lease) and
// errors go to RelayConfig.Logger, by default slog.Default(), each with a
// "relay" attribute; becoming active is logged at Info, and so is a claim
// that waited for a row another session holds; standing by at Debug. To silence the relay, configure a logger that drops them.
//
// Decisions: claims are serialised by a transaction-scoped advisory lock
// (one short statement each), because the key-order check must see every
// other relay's committed claims. When a relay crashes after the broker
// confirmed but before it recorded that, the event is published again (by
// the relay taking the lease over, or after the claim lease): duplicates
// happen around crashes, pauses and lost connections, and when a
// publication takes longer than ClaimLease (a broker stall). The claim
// then runs out while its batch is in flight, and a later claim, of the
// same relay or another, may claim those events again and publish them a
// second time, so keep ClaimLease well above the longest publication (the
// publisher's own timeouts). First deliveries stay in key order either
// way: a key's next event is claimed only once a publication of the one
// before it was confirmed and recorded.
//
// # Observability
//
// Write adds the trace context of its context's span to an event's headers
// when they carry none (Config.Propagator, W3C traceparent/tracestate by
// default). With RelayConfig.MeterProvider the relay reports
// llmq.outbox.events ({event}; result = published | failed: its rate is the
// publish rate), llmq.outbox.publish.duration (s; one batch until the
// broker confirmed), and, while Run is the active relay, the observable gauges
// llmq.outbox.pending ({event}) and llmq.outbox.lag (s; age of the oldest
// unpublished event), read through outbox_pending_idx at most once per
// RelayConfig.GaugeRefresh (default 15s): the count reads one index entry
// per unpublished event, the age one entry. Only the active relay reports
// these two, so a fleet reads the backlog once per refresh, not once per
// pod. Every running relay reports llmq.outbox.relay.active ({relay}; 1
// while it holds the leader lease). With RelayConfig.TracerProvider
// each event that carries a trace context is published in a producer span
// "publish <topic>", a child of the writer's span, whose context replaces
// the writer's in the message headers so consumers continue the trace
// through it; events written outside a trace get no span.
package outbox
