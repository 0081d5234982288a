package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/retry"
)

// maxPollRecords bounds one poll: the records admitted between a poll and
// AllowRebalance, during which a rebalance waits.
const maxPollRecords = 500

// fetchMaxWait bounds how long a fetch with no new data waits at the broker;
// a resumed partition is fetched at the latest this long after resuming.
const fetchMaxWait = 500 * time.Millisecond

// Consumer is a broker.Consumer of a Kafka consumer group. See the package
// documentation for its commit, pause and rebalance behaviour.
type Consumer struct {
	cfg ConsumerConfig
	cl  *kgo.Client

	// commitMu orders commits with revocations: a commit computed before a
	// partition is revoked is sent before the revocation's own commit and
	// drop, never after.
	commitMu sync.Mutex

	mu          sync.Mutex
	parts       map[topicPartition]*partition
	ready       []*Delivery   // received by poll, waiting for Receive, in fetch order
	wake        chan struct{} // closed and replaced whenever ready grows
	closed      bool
	revocations int64
	losses      int64

	done  chan struct{} // closed by Close
	stop  context.CancelFunc
	loops sync.WaitGroup
}

type topicPartition struct {
	topic     string
	partition int32
}

// partition is this consumer's state for one partition it owns. A
// revocation or loss drops it; a later assignment of the same partition
// starts a new one, from the group's committed offset.
type partition struct {
	tp        topicPartition
	tracker   *tracker
	paused    bool
	dropped   bool  // revoked or lost: its deliveries can no longer settle
	committed int64 // the offset last committed by this consumer; -1 before any
}

var _ broker.Consumer = (*Consumer)(nil)

// NewConsumer validates cfg, joins the group and starts fetching. Records
// are fetched in the background into a bounded buffer that Receive drains.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, parts: map[topicPartition]*partition{}, wake: make(chan struct{}), done: make(chan struct{})}
	opts := append(cfg.Publisher.producerOpts(),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		// Between a poll and AllowRebalance no revocation runs, so the
		// records of a poll are admitted whole before a revocation can
		// drop their partition, and none arrives after it.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.FetchMaxWait(fetchMaxWait),
	)
	if !cfg.ReadUncommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout))
	}
	if cfg.RebalanceTimeout > 0 {
		opts = append(opts, kgo.RebalanceTimeout(cfg.RebalanceTimeout))
	}
	c.cl, err = kgo.NewClient(append(opts, cfg.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.loops.Go(func() { c.poll(ctx) })
	c.loops.Go(func() { c.commitLoop(ctx) })
	return c, nil
}

// poll fetches records into the ready buffer until ctx ends. It never waits
// on receivers: a full partition is paused instead, so the loop keeps
// polling and AllowRebalance is never held back by slow processing.
func (c *Consumer) poll(ctx context.Context) {
	for {
		// At most MaxInFlight records a poll: a partition that reaches the
		// bound within a poll overshoots it by less than MaxInFlight. The
		// rest of a fetch stays in the client, and is dropped and fetched
		// again later if its partition is paused meanwhile.
		fetches := c.cl.PollRecords(ctx, min(c.cfg.MaxInFlight, maxPollRecords))
		if ctx.Err() != nil || fetches.IsClientClosed() {
			c.cl.AllowRebalance()
			return
		}
		failed := false
		fetches.EachError(func(topic string, p int32, err error) {
			failed = true
			c.cfg.Logger.Warn("llmq: kafka fetch failed", "group", c.cfg.Group, "topic", topic, "partition", p, "err", err)
		})
		c.mu.Lock()
		fetches.EachRecord(c.admitLocked)
		c.mu.Unlock()
		c.cl.AllowRebalance()
		if failed && fetches.NumRecords() == 0 && !retry.Sleep(ctx, 200*time.Millisecond) {
			return
		}
	}
}

// admitLocked tracks a fetched record and queues it for Receive, pausing
// its partition when the partition reaches MaxInFlight.
func (c *Consumer) admitLocked(r *kgo.Record) {
	tp := topicPartition{r.Topic, r.Partition}
	p := c.parts[tp]
	if p == nil {
		p = &partition{tp: tp, tracker: newTracker(), committed: -1}
		c.parts[tp] = p
	}
	if !p.tracker.add(r.Offset, r.LeaderEpoch) {
		return // already tracked: a re-fetch
	}
	c.pushLocked(&Delivery{c: c, part: p, rec: r, msg: toMessage(r), attempt: 1})
	if !p.paused && p.tracker.inFlight() >= c.cfg.MaxInFlight {
		p.paused = true
		c.cl.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	}
}

func (c *Consumer) pushLocked(d *Delivery) {
	c.ready = append(c.ready, d)
	close(c.wake)
	c.wake = make(chan struct{})
}

// Receive returns the next fetched record, waiting until there is one, ctx
// ends, or the consumer is closed (broker.ErrClosed). Records of one
// partition are returned in offset order, except that a Nacked record
// comes back after NackDelay, behind those fetched meanwhile. Safe for
// concurrent use.
func (c *Consumer) Receive(ctx context.Context) (broker.Delivery, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, broker.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			c.mu.Unlock()
			return nil, fmt.Errorf("kafka: receive: %w", err)
		}
		for len(c.ready) > 0 {
			d := c.ready[0]
			c.ready[0] = nil
			c.ready = c.ready[1:]
			if !d.part.dropped {
				c.mu.Unlock()
				return d, nil
			}
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-wake:
		case <-c.done:
		}
	}
}

// Commit commits, for every partition this consumer owns, the offset after
// its prefix of settled records, where that moved since the last commit.
// The consumer does this every CommitInterval, on revocation and on Close;
// Commit makes it happen now.
func (c *Consumer) Commit(ctx context.Context) error {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	offsets, parts := c.committableLocked(nil)
	c.mu.Unlock()
	if err := c.commitSync(ctx, offsets); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range parts {
		p.committed = max(p.committed, offsets[p.tp.topic][p.tp.partition].Offset)
	}
	return nil
}

// committableLocked returns the offsets to commit for the owned partitions
// in only (all owned partitions if only is nil) whose committable offset
// moved past what this consumer last committed.
func (c *Consumer) committableLocked(only map[string][]int32) (map[string]map[int32]kgo.EpochOffset, []*partition) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	var parts []*partition
	add := func(p *partition) {
		off, epoch, ok := p.tracker.committable()
		if !ok || off <= p.committed {
			return
		}
		if offsets[p.tp.topic] == nil {
			offsets[p.tp.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[p.tp.topic][p.tp.partition] = kgo.EpochOffset{Epoch: epoch, Offset: off}
		parts = append(parts, p)
	}
	if only == nil {
		for _, p := range c.parts {
			add(p)
		}
		return offsets, parts
	}
	for topic, ps := range only {
		for _, n := range ps {
			if p := c.parts[topicPartition{topic, n}]; p != nil {
				add(p)
			}
		}
	}
	return offsets, parts
}

// commitSync commits offsets and reports the request's or any partition's
// error.
func (c *Consumer) commitSync(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error {
	if len(offsets) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	var errs []error
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err))
				}
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kafka: committing offsets of group %s: %w", c.cfg.Group, err)
	}
	return nil
}

func (c *Consumer) commitLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.Commit(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("llmq: kafka offset commit failed; it is retried", "group", c.cfg.Group, "err", err)
			}
		}
	}
}

// onRevoked runs when partitions leave this member in a rebalance (and on
// Close, which leaves the group). The partitions' state is dropped first,
// so a delivery settled from then on gets ErrRevoked rather than being
// acknowledged and then forgotten; then what was durable is committed, for
// the next owner to start from.
func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	offsets, _ := c.committableLocked(revoked)
	if c.dropLocked(revoked) {
		c.revocations++
	}
	c.mu.Unlock()
	// The client's context is cancelled during Close, and this commit must
	// still go out: it has its own bound.
	if err := c.commitSync(context.WithoutCancel(ctx), offsets); err != nil {
		c.cfg.Logger.Warn("llmq: kafka commit on revocation failed; the new owner redelivers from the previous commit", "group", c.cfg.Group, "err", err)
	}
}

// onLost runs when the member lost its partitions without a rebalance
// (session expired, fenced): another member may already own them, so
// nothing is committed.
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dropLocked(lost) {
		c.losses++
	}
}

// dropLocked forgets the partitions: their queued deliveries are removed,
// their outstanding ones can no longer settle, and their pause is lifted so
// that a later assignment of the partition starts fetching afresh. It
// reports whether tps named any partition (kgo also calls its revocation
// callback with none at the end of a group session).
func (c *Consumer) dropLocked(tps map[string][]int32) (named bool) {
	resume := map[string][]int32{}
	for topic, ps := range tps {
		for _, n := range ps {
			named = true
			tp := topicPartition{topic, n}
			p := c.parts[tp]
			if p == nil {
				continue
			}
			p.dropped = true
			delete(c.parts, tp)
			if p.paused {
				resume[topic] = append(resume[topic], n)
			}
		}
	}
	kept := c.ready[:0]
	for _, d := range c.ready {
		if !d.part.dropped {
			kept = append(kept, d)
		}
	}
	clear(c.ready[len(kept):])
	c.ready = kept
	if len(resume) > 0 {
		c.cl.ResumeFetchPartitions(resume)
	}
	return named
}

// Stats is a snapshot of a Consumer.
type Stats struct {
	// Partitions is how many partitions the consumer holds records of.
	Partitions int
	// InFlight counts records fetched and not yet committable, over all
	// partitions; Ready those of them waiting for Receive.
	InFlight, Ready int
	// Paused lists the partitions the client is not fetching, by topic.
	Paused map[string][]int32
	// Revocations and Losses count the rebalance callbacks that took
	// partitions away.
	Revocations, Losses int64
}

// Stats reports the consumer's state.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Partitions: len(c.parts), Ready: len(c.ready), Revocations: c.revocations, Losses: c.losses}
	for _, p := range c.parts {
		s.InFlight += p.tracker.inFlight()
	}
	s.Paused = c.cl.PauseFetchPartitions(nil)
	return s
}

// Close stops receiving, commits what is durable, and leaves the group, so
// that the partitions move to the remaining members at once. Deliveries
// still unsettled are delivered again to the partitions' next owners;
// settling them afterwards fails with broker.ErrClosed. Close is
// idempotent.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	c.stop()
	c.loops.Wait()
	// No delivery can settle any more: this commit is final. Leaving the
	// group then runs onRevoked, which finds nothing new to commit.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
	defer cancel()
	err := c.Commit(ctx)
	c.cl.Close()
	if err != nil {
		return fmt.Errorf("kafka: close: the final commit failed; the uncommitted records are delivered again: %w", err)
	}
	return nil
}

// Delivery is one record received from a Consumer.
type Delivery struct {
	c       *Consumer
	part    *partition
	rec     *kgo.Record
	msg     broker.Message
	attempt int

	settled bool // guarded by c.mu
}

var _ broker.Delivery = (*Delivery)(nil)

// Message returns the record as a broker.Message.
func (d *Delivery) Message() broker.Message { return d.msg }

// Source names the record's topic, partition and offset.
func (d *Delivery) Source() broker.Source {
	return broker.Source{Topic: d.rec.Topic, Partition: d.rec.Partition, Offset: d.rec.Offset}
}

// Attempt returns how many times this consumer delivered the record, this
// delivery included: 1 the first time, more after Nack. A redelivery by
// another member after a rebalance starts again at 1.
func (d *Delivery) Attempt() int { return d.attempt }

// Ack marks the record done. Its offset is committed once every earlier
// record of its partition is done too, at the next commit; a crash before
// that commit delivers it again (receivers deduplicate by ID).
// It takes effect at once, whatever ctx: an ended context does not leave
// the record undone.
func (d *Delivery) Ack(context.Context) error {
	return d.settle("ack", func() { d.doneLocked() })
}

// Nack hands the record back: this consumer delivers it again after
// NackDelay. Until it is settled its partition commits nothing past it.
// Like Ack it takes effect at once, whatever ctx.
func (d *Delivery) Nack(context.Context) error {
	return d.settle("nack", func() { d.redeliverLater() })
}

// Reject produces the record to the dead-letter topic, with
// HeaderDeadLetterReason and HeaderDeadLetterSource added, and then marks
// it done. If the dead-letter produce fails (ctx ended included), the
// record is handed back as by Nack and the error returned. A record
// dead-lettered just before its partition was revoked may be dead-lettered
// again by the next owner.
func (d *Delivery) Reject(ctx context.Context, reason error) error {
	if err := d.settle("reject", func() {}); err != nil {
		return err
	}
	c := d.c
	rec := deadLetter(d.rec, c.cfg.DeadLetterTopic, reason)
	if err := c.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		d.redeliverLater()
		return fmt.Errorf("kafka: dead-lettering %q to %s: %w; it will be delivered again", d.msg.ID, rec.Topic, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.part.dropped {
		return fmt.Errorf("kafka: reject %q: dead-lettered, but %w", d.msg.ID, ErrRevoked)
	}
	d.doneLocked()
	return nil
}

// settle claims the delivery's one verdict and applies it under c.mu. The
// context is not consulted: Ack and Nack only mark the record in memory,
// so they take effect at once, and a verdict refused for an ended context
// (a settle deadline that passed) would leave the record neither done nor
// redelivered, its partition committing nothing past it for good.
// Reject's produce honours its context, and hands the record back if it
// fails.
func (d *Delivery) settle(verdict string, apply func()) error {
	c := d.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case d.settled:
		return fmt.Errorf("kafka: %s %q: %w", verdict, d.msg.ID, ErrAlreadySettled)
	case c.closed:
		return fmt.Errorf("kafka: %s %q: the consumer was closed, so it will be delivered again: %w", verdict, d.msg.ID, broker.ErrClosed)
	case d.part.dropped:
		return fmt.Errorf("kafka: %s %q: %w", verdict, d.msg.ID, ErrRevoked)
	}
	d.settled = true
	apply()
	return nil
}

// doneLocked marks the record done and resumes its partition once it has
// drained to half of MaxInFlight.
func (d *Delivery) doneLocked() {
	p, c := d.part, d.c
	p.tracker.done(d.rec.Offset)
	if p.paused && p.tracker.inFlight() <= c.cfg.MaxInFlight/2 {
		p.paused = false
		c.cl.ResumeFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
	}
}

// redeliverLater queues the record again after NackDelay, unless by then
// its partition or the consumer is gone, in which case the partition's
// next owner has it from the committed offset.
func (d *Delivery) redeliverLater() {
	c := d.c
	time.AfterFunc(c.cfg.NackDelay, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed || d.part.dropped {
			return
		}
		c.pushLocked(&Delivery{c: c, part: d.part, rec: d.rec, msg: d.msg, attempt: d.attempt + 1})
	})
}

// deadLetter builds the dead-letter record of r.
func deadLetter(r *kgo.Record, topic string, reason error) *kgo.Record {
	if topic == "" {
		topic = r.Topic + ".dlq"
	}
	why := "rejected"
	if reason != nil {
		why = reason.Error()
	}
	headers := append(make([]kgo.RecordHeader, 0, len(r.Headers)+2), r.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDeadLetterReason, Value: []byte(why)},
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: fmt.Appendf(nil, "%s/%d/%d", r.Topic, r.Partition, r.Offset)},
	)
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: headers}
}
