// Package kafka connects llmq to Kafka: the outbox relay publishes events to
// Kafka topics through it, and the inbox ingress consumes them. Hosts that
// run Kafka use it in place of broker/memory; it adapts the broker contract
// on franz-go (kgo).
//
// Its Publisher confirms a message only when every in-sync replica has it,
// and its group Consumer commits an offset only when every record before it
// was settled.
//
//	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers})
//	relay, err := outboxStore.NewRelay(pool, pub, outbox.RelayConfig{})
//
//	c, err := kafka.NewConsumer(kafka.ConsumerConfig{Brokers: brokers, Group: "erp", Topics: []string{"invoices"}})
//	in, err := inboxStore.NewIngress(pool, c, inbox.IngressConfig{Consumer: "erp", Handler: h})
//
// # Publisher
//
//   - Idempotent producer with acks from all in-sync replicas: a retry
//     neither duplicates nor reorders records within a partition.
//   - The record key is Message.Key, so a key's messages share a partition
//     and its order. The id travels in the HeaderMessageID header
//     ("llmq-event-id", as the outbox names it), Message.Headers as record
//     headers.
//   - Publish waits for each record's acknowledgement and returns nil only
//     if all were acknowledged; a *broker.PublishError names the others.
//     A record fails after PublisherConfig.DeliveryTimeout (or
//     RecordRetries attempts).
//   - Within one Publish call a key's messages are produced one at a time,
//     each after the previous was acknowledged, and once one fails the
//     rest of its key fail unproduced (ErrEarlierFailed). The client's own
//     ordering is not enough: a failed batch fails the records buffered
//     behind it, but records produced a moment later go through, so a
//     key's later message could be confirmed while an earlier one failed.
//     Across calls the outbox relay keeps the order (it holds a key's later
//     events while an earlier one is backing off). Different keys, and
//     messages without a key, are produced concurrently.
//
// # Consumer
//
//   - A consumer group with auto-commit off. Each partition's fetched
//     records are tracked in offset order; the committed offset is one
//     past the longest prefix of settled records (acked or rejected).
//     Record 41 acked while 40 is pending commits nothing past 40. Commits
//     run every CommitInterval, on revocation, on Close, and on Commit.
//   - Ack is durable at the next commit: a crash before it delivers the
//     record again, and receivers deduplicate by id (package inbox). That
//     is the contract's at-least-once; Ack never waits for a commit, which
//     an earlier pending record could hold back indefinitely.
//   - Nack keeps the record pending (its partition commits nothing past
//     it) and delivers it again, from memory, after NackDelay, behind the
//     records fetched meanwhile. A restart redelivers it from the commit.
//   - Reject produces the record to the dead-letter topic
//     (ConsumerConfig.DeadLetterTopic, default "<topic>.dlq", which must
//     exist) with HeaderDeadLetterReason and HeaderDeadLetterSource, and
//     only then marks it settled. If that produce fails the record is
//     handed back as by Nack.
//   - No verdict strands a record: Ack and Nack take effect at once and
//     ignore their context, as RabbitMQ's do, and a Reject whose produce
//     fails, for an ended context too, hands the record back. A record
//     neither done nor redelivered would hold its partition's commit, and
//     then its fetching (MaxInFlight), for good.
//   - Back-pressure: a partition whose records not yet committable reach
//     MaxInFlight is paused (kgo PauseFetchPartitions) and resumed once
//     they are down to half. Fetching stops, polling and heartbeats do
//     not: heartbeats run on their own in kgo, and the poll loop never
//     waits for receivers, so a full dispatcher never costs the member
//     its place in the group.
//   - Rebalances (kgo.BlockRebalanceOnPoll, OnPartitionsRevoked and
//     OnPartitionsLost): a poll's records are admitted before any
//     revocation runs, and none of a revoked partition arrives after it.
//     On revocation the partition's state is dropped, then the settled
//     prefix is committed; on loss (session expired, fenced) it is dropped
//     without committing, since another member may own it. A delivery of a
//     dropped partition cannot settle: Ack, Nack and Reject return
//     ErrRevoked and the new owner receives the record again from the
//     committed offset. Pauses are the client's and outlive rebalances: a
//     partition kept across a cooperative rebalance stays paused with its
//     state, a dropped one is resumed so that a later assignment starts
//     fetching afresh.
//   - Receive is safe for concurrent callers; records of a partition are
//     handed out in offset order, which concurrent receivers then process
//     in any order.
//   - Committed reads: the consumer reads with isolation level
//     read_committed (ConsumerConfig.ReadUncommitted opts out, to kgo's
//     and Kafka's default read_uncommitted). Records of a producer's
//     aborted transaction are never delivered, and a partition is read only
//     up to its last stable offset: records behind a transaction still open
//     wait until it ends. Aborted records and transaction markers leave
//     gaps in the offsets, which the commit passes over.
//   - A record that can never be accepted (no id, a null value unless
//     inbox.IngressConfig.Tombstones says to skip or handle tombstones, an
//     id or header that is not valid UTF-8) does not stop its partition:
//     package inbox quarantines it and rejects it to the dead-letter topic,
//     and a record whose handling keeps failing is rejected after
//     inbox.IngressConfig.MaxAttempts failures. The dead-letter record is
//     the original, byte for byte (a null value stays null), with the two
//     dead-letter headers added.
//
// # Foreign producers
//
// Records written by other clients are read like llmq's own; what a
// broker.Message cannot hold is mapped as follows (see package broker):
//
//   - Message.ID is the value of the last HeaderMessageID header; without
//     one, or with a null value, it is "" and the inbox quarantines the
//     record.
//   - A null value (a tombstone) is a nil Body, an empty value an empty,
//     non-nil Body. The inbox quarantines null bodies by default; on
//     change-data-capture topics, which hold a tombstone after each
//     deletion, inbox.IngressConfig.Tombstones skips them (acknowledged
//     and committed past, unrecorded) or hands them to the handler.
//   - A null key and an empty key are both Key "".
//   - A null header value is ""; of a header repeated in one record only
//     the last value is kept in Headers (the dead-letter record keeps them
//     all).
//
// Per-key order across producers needs one partitioner: the publisher
// uses kgo's default, which hashes a non-empty key with murmur2 as the
// Java client does (its default partitioner is compatible). librdkafka
// (and kcat, confluent-kafka-go, confluent-kafka-python) defaults to
// CRC32 ("consistent_random"), which puts most keys on another partition:
// configure it with partitioner=murmur2_random. A message without a key
// goes to any partition, as a null key does in every client.
//
// Decisions where the contract is silent: offsets are committed with
// kgo's CommitOffsetsSync and an explicit offset per partition, not
// CommitRecords or CommitUncommittedOffsets, which commit past the highest
// record polled or named and so past records still pending; the commit
// loop and the revocation callback share a lock, so a commit computed
// before a revocation is never sent after it. Redelivery after Nack is local
// (Kafka has no per-record requeue, and seeking back would redeliver
// everything after it); a consumer that closes commits its settled prefix
// and leaves the group at once, so its partitions move without waiting for
// the session timeout; a record without an id header arrives with an empty
// Message.ID, which package inbox quarantines and rejects. The publisher
// never writes a tombstone: a nil Body is produced as an empty value.
package kafka
