package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

// Headers every relayed message carries besides the event's own.
const (
	HeaderEventID     = "llmq-event-id"
	HeaderEventType   = "llmq-event-type"
	HeaderAggregateID = "llmq-aggregate-id"
)

// RelayConfig configures a Relay. Zero values mean the documented defaults.
type RelayConfig struct {
	// ID names this relay on the events it claims and in the leader
	// lease; it must be unique among the relays of an outbox. Default:
	// host name, process id and a random suffix.
	ID string
	// BatchSize is the most events one claim takes. Default 100, at most
	// 1000.
	BatchSize int
	// ClaimLease is how long a claim holds its events. When an active
	// relay (Run) dies mid-batch, the relay taking the leader lease over
	// releases its claims at once, and an active relay whose connection
	// failed releases its own (see the package documentation, Lost
	// connections); claims of RelayOnce and Drain callers are reclaimed
	// this long after they were made. A publication that
	// takes longer (a broker stall) lets a later claim take its events
	// again, and they are published twice (see the package
	// documentation): keep it well above the longest publication, whose
	// claim may have been made while the batch before it was published.
	// Default 30s.
	ClaimLease time.Duration
	// PollInterval is the fallback claim interval when no NOTIFY arrives.
	// Default 500ms.
	PollInterval time.Duration
	// DisableListen stops the active relay from LISTENing for the
	// outbox's NOTIFYs, so that it holds no connection outside its pool:
	// for a pool behind a connection pooler in transaction mode, which
	// cannot keep a LISTEN (see the package documentation, Connection
	// poolers). The relay then finds events by polling, every
	// PollInterval. Default false: listen.
	DisableListen bool
	// Backoff delays an event after a failed publication. Default base 1s,
	// cap 60s.
	Backoff llmqtype.BackoffPolicy
	// Retention is how long published events stay before the pruner
	// deletes them. Default 24h.
	Retention time.Duration
	// DeletePublished deletes each event as soon as the broker confirmed
	// it, instead of keeping it, marked published, for Retention. The
	// relay then writes less than a quarter of the WAL per event that
	// relaying and pruning a kept event write (see the package
	// documentation, Storage), and leaves no history of published events:
	// Store.ListByAggregate, the console's job page and llmq inspect then
	// show only the events still waiting. Events published before it was
	// set are still pruned after Retention.
	DeletePublished bool
	// PruneInterval is how often the active relay prunes. Default 1
	// minute.
	PruneInterval time.Duration
	// LeaderLease is how long the active relay's lease lasts without a
	// renewal; it renews every third of it. When the active relay dies,
	// a standby takes over within LeaderLease + StandbyPoll, at most twice
	// LeaderLease. Default 10s, at least 100ms.
	LeaderLease time.Duration
	// StandbyPoll is the longest a standby relay waits between checks of
	// whether the lease is free. A standby waits until the lease it saw
	// would expire without a renewal, but at least half of StandbyPoll
	// and at most all of it, shortened by up to an eighth at random. At
	// most LeaderLease. Default LeaderLease/2.
	StandbyPoll time.Duration
	// Logger receives operational messages, each with a "relay" attribute
	// (the ID). Default: slog.Default(), so warnings and errors are seen
	// unless a logger is configured to drop them.
	Logger *slog.Logger
	// MeterProvider receives the relay's metrics (see the package
	// documentation). Nil means none.
	MeterProvider metric.MeterProvider
	// GaugeRefresh is the longest the backlog gauges reuse one reading of
	// the database. Default 15s.
	GaugeRefresh time.Duration
	// TracerProvider receives a producer span per published event that
	// carries a trace context. Nil means none.
	TracerProvider trace.TracerProvider
	// Propagator reads an event's trace context from its headers and writes
	// the publish span's in its place. Default: W3C TraceContext
	// (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// ErrInvalidRelayConfig is matched (errors.Is) by every error NewRelay
// returns for a bad RelayConfig.
var ErrInvalidRelayConfig = errors.New("outbox: invalid relay configuration")

// Relay publishes committed outbox events through a broker.Publisher and
// marks them published only after the broker confirmed them.
type Relay struct {
	store  *Store
	pool   *pgxpool.Pool
	pub    broker.Publisher
	cfg    RelayConfig
	lockID string

	// Where the next claim starts (see ClaimEvents), and when a claim last
	// started from the beginning. RelayOnce calls are not concurrent for
	// one Relay; Run makes them one at a time.
	floor     atomic.Int64
	fullScans atomic.Int64 // unix nanoseconds of the last claim from seq 0
	// Until when (unix nanoseconds) claims skip locked rows instead of
	// waiting for them, and how long a lock-free claim waits for a row
	// (claimLockTimeout; tests lengthen it). See claim.
	skipLockedUntil atomic.Int64
	lockTimeout     time.Duration
	// What verdicts could not record because another session held the
	// events' rows: recorded by the next transaction that records one
	// (see queueVerdict).
	heldMu sync.Mutex
	held   *verdict

	published, failed atomic.Int64
	active            atomic.Bool // Run holds the leader lease
	obs               *relayInstruments
}

// NewRelay validates cfg and returns a relay for the store's outbox.
func (s *Store) NewRelay(pool *pgxpool.Pool, pub broker.Publisher, cfg RelayConfig) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, fmt.Errorf("%w: NewRelay needs a pool and a publisher", ErrInvalidRelayConfig)
	}
	for name, d := range map[string]time.Duration{
		"ClaimLease": cfg.ClaimLease, "PollInterval": cfg.PollInterval,
		"Retention": cfg.Retention, "PruneInterval": cfg.PruneInterval, "GaugeRefresh": cfg.GaugeRefresh,
		"LeaderLease": cfg.LeaderLease, "StandbyPoll": cfg.StandbyPoll,
	} {
		if d < 0 {
			return nil, fmt.Errorf("%w: %s is %s; use 0 for the default or a positive duration", ErrInvalidRelayConfig, name, d)
		}
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > 1000 {
		return nil, fmt.Errorf("%w: BatchSize is %d; use 0 for the default or 1 to 1000", ErrInvalidRelayConfig, cfg.BatchSize)
	}
	if err := cfg.Backoff.Validate(); err != nil {
		return nil, fmt.Errorf("%w: Backoff: %w", ErrInvalidRelayConfig, err)
	}
	if cfg.LeaderLease != 0 && cfg.LeaderLease < minLeaderLease {
		return nil, fmt.Errorf("%w: LeaderLease is %s; use 0 for the default or at least %s", ErrInvalidRelayConfig, cfg.LeaderLease, minLeaderLease)
	}
	cfg.LeaderLease = cmp.Or(cfg.LeaderLease, defaultLeaderLease)
	if cfg.StandbyPoll > cfg.LeaderLease {
		return nil, fmt.Errorf("%w: StandbyPoll %s is longer than LeaderLease %s; a standby must check at least once per lease", ErrInvalidRelayConfig, cfg.StandbyPoll, cfg.LeaderLease)
	}
	cfg.StandbyPoll = cmp.Or(cfg.StandbyPoll, cfg.LeaderLease/2)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 100)
	cfg.ClaimLease = cmp.Or(cfg.ClaimLease, 30*time.Second)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 500*time.Millisecond)
	cfg.Backoff = llmqtype.BackoffPolicy{Base: cmp.Or(cfg.Backoff.Base, time.Second), Cap: cmp.Or(cfg.Backoff.Cap, time.Minute)}
	cfg.Retention = cmp.Or(cfg.Retention, 24*time.Hour)
	cfg.PruneInterval = cmp.Or(cfg.PruneInterval, time.Minute)
	cfg.GaugeRefresh = cmp.Or(cfg.GaugeRefresh, defaultGaugeRefresh)
	if cfg.ID == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		cfg.ID = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("relay", cfg.ID)
	obs, err := newRelayInstruments(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: instruments: %w", ErrInvalidRelayConfig, err)
	}
	return &Relay{store: s, pool: pool, pub: pub, cfg: cfg, obs: obs, lockID: "llmq.outbox.claim:" + s.schema.Name(), lockTimeout: claimLockTimeout}, nil
}

// defaultGaugeRefresh is RelayConfig.GaugeRefresh's default.
const defaultGaugeRefresh = 15 * time.Second

// BatchResult counts what one RelayOnce did. Claimed is Published +
// Failed + Deferred.
type BatchResult struct {
	Claimed, Published, Failed int
	// Deferred counts events of batch rows (Store.WriteBatch) moved into
	// single-event rows unpublished, to wait for an earlier event of their
	// key, or because their row was claimed before and never settled (see
	// the package documentation, Batch rows).
	Deferred int
}

// verdict is the broker's answer for one batch, to be recorded in the
// outbox: which events to mark published and which to back off.
type verdict struct {
	firstSeq  int64 // the batch's lowest seq
	published [][16]byte
	failed    [][16]byte
	errs      []string
	delays    []int64
	batches   []batchVerdict // batch rows, settled by SettleBatch
}

// result counts what the batch behind v came to: every claimed event was
// either confirmed, not, or split out unpublished.
func (v *verdict) result() BatchResult {
	if v == nil {
		return BatchResult{}
	}
	res := BatchResult{Published: len(v.published), Failed: len(v.failed)}
	for _, bv := range v.batches {
		res.Published += bv.published
		res.Failed += bv.refused
		res.Deferred += len(bv.split) - bv.refused
	}
	res.Claimed = res.Published + res.Failed + res.Deferred
	return res
}

func (v *verdict) hasBatches() bool { return v != nil && len(v.batches) > 0 }

func (v *verdict) empty() bool {
	return v == nil || len(v.published) == 0 && len(v.failed) == 0 && len(v.batches) == 0
}

// merge returns the verdicts of both batches as one.
func (v *verdict) merge(o *verdict) *verdict {
	switch {
	case v.empty():
		return o
	case o.empty():
		return v
	}
	return &verdict{
		firstSeq:  min(v.firstSeq, o.firstSeq),
		published: append(slices.Clip(v.published), o.published...),
		failed:    append(slices.Clip(v.failed), o.failed...),
		errs:      append(slices.Clip(v.errs), o.errs...),
		delays:    append(slices.Clip(v.delays), o.delays...),
		batches:   append(slices.Clip(v.batches), o.batches...),
	}
}

// skippedSet is what a verdict's transaction could not record because
// another session held the rows: events by id, batch rows by first seq.
type skippedSet struct {
	ids     map[[16]byte]bool
	batches map[int64]bool
}

func newSkippedSet() skippedSet {
	return skippedSet{ids: map[[16]byte]bool{}, batches: map[int64]bool{}}
}

func (s skippedSet) empty() bool { return len(s.ids) == 0 && len(s.batches) == 0 }

// only returns the part of v about what skipped holds.
func (v *verdict) only(skipped skippedSet) *verdict {
	if v.empty() || skipped.empty() {
		return nil
	}
	ids := skipped.ids
	o := &verdict{firstSeq: v.firstSeq}
	for _, bv := range v.batches {
		if skipped.batches[bv.firstSeq] {
			o.batches = append(o.batches, bv)
		}
	}
	for _, id := range v.published {
		if ids[id] {
			o.published = append(o.published, id)
		}
	}
	for i, id := range v.failed {
		if ids[id] {
			o.failed = append(o.failed, id)
			o.errs = append(o.errs, v.errs[i])
			o.delays = append(o.delays, v.delays[i])
		}
	}
	return o
}

// without returns v without what skipped holds.
func (v *verdict) without(skipped skippedSet) *verdict {
	if v == nil || skipped.empty() {
		return v
	}
	ids := skipped.ids
	o := &verdict{firstSeq: v.firstSeq}
	for _, bv := range v.batches {
		if !skipped.batches[bv.firstSeq] {
			o.batches = append(o.batches, bv)
		}
	}
	for _, id := range v.published {
		if !ids[id] {
			o.published = append(o.published, id)
		}
	}
	for i, id := range v.failed {
		if !ids[id] {
			o.failed = append(o.failed, id)
			o.errs = append(o.errs, v.errs[i])
			o.delays = append(o.delays, v.delays[i])
		}
	}
	return o
}

// queueVerdict adds the statements recording v to b, which must run in one
// transaction. RelaxCommit (see queries.sql) makes it commit without
// waiting for its WAL flush. Lock-free, the statements wait for a row
// another session holds (under the transaction's lock timeout); skipping
// locked rows, they step over it and add its event to skipped, whose part
// of v the caller keeps for a later transaction (see
// MarkPublishedSkippingLocked). A batch row's verdict always skips a
// locked row (SettleBatch: one row lock per batch row costs next to
// nothing).
func (r *Relay) queueVerdict(b *pgx.Batch, v *verdict, skipLocked bool, skipped skippedSet) {
	if v.empty() {
		return
	}
	collect := func(rows pgx.Rows) error {
		ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
		for _, id := range ids {
			skipped.ids[id] = true
		}
		return err
	}
	b.Queue(r.store.sql.relaxCommit)
	if len(v.published) > 0 {
		mark, markSkipping := r.store.sql.markPublished, r.store.sql.markPublishedSkippingLocked
		if r.cfg.DeletePublished {
			mark, markSkipping = r.store.sql.deletePublished, r.store.sql.deletePublishedSkippingLocked
		}
		if skipLocked {
			b.Queue(markSkipping, r.cfg.ID, dbsql.UUIDs(v.published)).Query(collect)
		} else {
			b.Queue(mark, r.cfg.ID, dbsql.UUIDs(v.published))
		}
	}
	if len(v.failed) > 0 {
		if skipLocked {
			b.Queue(r.store.sql.markFailedSkippingLocked, r.cfg.ID, dbsql.UUIDs(v.failed), v.errs, v.delays).Query(collect)
		} else {
			b.Queue(r.store.sql.markFailed, r.cfg.ID, dbsql.UUIDs(v.failed), v.errs, v.delays)
		}
	}
	for _, bv := range v.batches {
		b.Queue(r.store.sql.settleBatch, bv.firstSeq, r.cfg.ID, bv.split, bv.errs, bv.delays, r.cfg.DeletePublished).
			QueryRow(func(row pgx.Row) error {
				var held int64
				if err := row.Scan(&held); err != nil {
					return err
				}
				if held > 0 {
					skipped.batches[bv.firstSeq] = true
				}
				return nil
			})
	}
	b.Queue(r.store.sql.restorePlans)
}

// takeHeld returns the verdicts kept for a later transaction, and forgets
// them; keepHeld keeps v.
func (r *Relay) takeHeld() *verdict {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	v := r.held
	r.held = nil
	return v
}

func (r *Relay) keepHeld(v *verdict) {
	if v.empty() {
		return
	}
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	r.held = r.held.merge(v)
}

// RelayOnce claims one batch, publishes it and records the broker's
// verdict on each event. Nothing is held open while publishing: the claim
// is its own short transaction, and so is the verdict. RelayOnce does not
// take the leader lease (see Run): it claims beside whichever relay is
// active, which is safe (key order holds across relays) but not faster.
func (r *Relay) RelayOnce(ctx context.Context) (BatchResult, error) {
	c, err := r.claim(ctx, nil, &claimRange{floor: r.startSeq(r.floor.Load()), ceiling: math.MaxInt64, epoch: unfenced})
	if err != nil {
		return BatchResult{}, fmt.Errorf("outbox: claiming events: %w", r.store.explain(err))
	}
	if len(c.recs) < r.cfg.BatchSize {
		r.floor.Store(0)
	} else {
		r.floor.Store(c.recs[0].Seq)
	}
	v := r.publish(ctx, c)
	return v.result(), r.store.explain(r.settle(ctx, v))
}

// Drain relays until a claim finds no event due, and returns what it did
// in total. It overlaps the database with the broker: while one batch is
// being published, the next is claimed, in the same transaction that
// records the verdict on the batch before. Key order still holds, because
// a key's next event cannot be claimed while its previous one is in
// flight (see ClaimEvents). The last verdict is recorded before Drain
// returns, also when it fails. Run relays the same way while it is the
// active relay; Drain, like RelayOnce, does not take the leader lease.
func (r *Relay) Drain(ctx context.Context) (BatchResult, error) {
	res, err := r.drain(ctx, unfenced, false)
	return res, r.store.explain(err)
}

// unfenced is the epoch of claims made outside the leader lease.
const unfenced = 0

// drain is Drain, its claims fenced by the lease epoch (or unfenced). With
// releaseOwn, its first claim, made with nothing of this relay in flight,
// releases the relay's own claims first (see ReleaseOwnClaims): Run asks
// for it after a pass the connection failed.
func (r *Relay) drain(ctx context.Context, epoch int64, releaseOwn bool) (BatchResult, error) {
	var (
		total   BatchResult
		carried *verdict // published, not yet recorded
		flight  *flight  // being published
		floor   int64
		// When the batch in flight holds every key with events waiting
		// (few keys, large batches), a claim overlapping it finds nothing.
		// After such a claim, the next serialAfterEmptyOverlap claims wait
		// for the batch before them to be published.
		serial int
	)
	for {
		if flight != nil && serial > 0 {
			serial--
			v := flight.wait()
			total.add(v.result())
			if !v.empty() {
				floor = min(floor, v.firstSeq) // see below: its keys' next events
			}
			carried, flight = carried.merge(v), nil
		}
		// A claim made while a batch is in flight looks only a little past
		// it (see ClaimEvents), so finding nothing costs little.
		ceiling := int64(math.MaxInt64)
		if flight != nil {
			ceiling = flight.lastSeq + overlapWindow*int64(r.cfg.BatchSize)
		}
		c, err := r.claim(ctx, carried, &claimRange{floor: r.startSeq(floor), ceiling: ceiling, epoch: epoch, releaseOwn: releaseOwn})
		if err != nil {
			if flight != nil {
				v := flight.wait()
				total.add(v.result())
				carried = carried.merge(v)
			}
			return total, errors.Join(fmt.Errorf("outbox: claiming events: %w", err), r.settle(ctx, carried))
		}
		carried = nil // recorded, or kept for later (see claim)
		releaseOwn = false
		if flight != nil && c.empty() {
			serial = serialAfterEmptyOverlap
		}
		if flight != nil {
			v := flight.wait()
			total.add(v.result())
			carried, flight = v, nil
		}
		// Where the next claim may start. It records the verdict taken
		// meanwhile, so an event it can claim is one of
		//   - the events this claim left out: none below the ceiling unless
		//     it was full, and then they lie above its first seq;
		//   - the next event of a key whose event that verdict records,
		//     above that batch's first seq.
		// Anything else (an event whose backoff ended, a late commit) waits
		// for the once-a-second claim from the beginning.
		full := len(c.recs) == r.cfg.BatchSize
		switch {
		case full:
			floor = c.recs[0].Seq
		case ceiling < math.MaxInt64:
			floor = ceiling
		default:
			floor = 0
		}
		if !carried.empty() {
			floor = min(floor, carried.firstSeq)
		}
		if !c.empty() {
			flight = r.startPublish(ctx, c)
			continue
		}
		if carried.empty() {
			return total, nil // nothing in flight, nothing claimable
		}
		// The batch just published may have held keys back: claim again
		// once its verdict is recorded.
	}
}

// serialAfterEmptyOverlap: see Drain.
const serialAfterEmptyOverlap = 32

// overlapWindow is how many batches' worth of seqs past the batch in
// flight a claim overlapping it looks at.
const overlapWindow = 2

// flight is a batch being published.
type flight struct {
	lastSeq int64
	done    chan struct{}
	v       *verdict
}

func (r *Relay) startPublish(ctx context.Context, c claimed) *flight {
	f := &flight{lastSeq: c.lastSeq(), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.v = r.publish(ctx, c)
	}()
	return f
}

func (f *flight) wait() *verdict {
	<-f.done
	return f.v
}

func (b *BatchResult) add(o BatchResult) {
	b.Claimed += o.Claimed
	b.Published += o.Published
	b.Failed += o.Failed
	b.Deferred += o.Deferred
}

// startSeq is the seq a claim starts from: floor, except at least once a
// second from the beginning, so that an event skipped meanwhile (one
// backing off, or committed late with a low seq) is never left behind.
func (r *Relay) startSeq(floor int64) int64 {
	if time.Since(time.Unix(0, r.fullScans.Load())) >= time.Second {
		floor = 0
	}
	if floor == 0 {
		r.fullScans.Store(time.Now().UnixNano())
	}
	return floor
}

// claimed is what one claim took: single-event rows and batch rows, each
// in write order.
type claimed struct {
	recs    []Record
	batches []*claimedBatch
}

func (c claimed) empty() bool { return len(c.recs) == 0 && len(c.batches) == 0 }

// lastSeq is the highest seq claimed.
func (c claimed) lastSeq() int64 {
	var last int64
	if len(c.recs) > 0 {
		last = c.recs[len(c.recs)-1].Seq
	}
	if len(c.batches) > 0 {
		last = max(last, c.batches[len(c.batches)-1].lastSeq())
	}
	return last
}

// publish publishes what c claimed and returns the broker's verdict on
// each event: the single-event rows first, then the batch rows' events
// (publishBatches). Their order does not matter: a batch row's event whose
// key has an earlier unpublished single-event row is never published from
// the row (ClaimBatches).
func (r *Relay) publish(ctx context.Context, c claimed) *verdict {
	v := r.publishSingles(ctx, c.recs)
	if len(c.batches) > 0 {
		first := c.batches[0].firstSeq
		if v == nil {
			v = &verdict{firstSeq: first}
		}
		v.firstSeq = min(v.firstSeq, first)
		v.batches = r.publishBatches(ctx, c.batches)
	}
	return v
}

// send publishes recs, in their order, and returns the broker's verdict on
// each (nil: confirmed) and its error.
func (r *Relay) send(ctx context.Context, recs []Record) ([]error, error) {
	msgs := make([]broker.Message, len(recs))
	for i, rec := range recs {
		msgs[i] = toMessage(rec)
	}
	spans := r.startPublishSpans(ctx, msgs, recs)
	started := time.Now()
	pubErr := r.pub.Publish(ctx, msgs)
	if hist := r.obs.publishDuration; hist.Enabled(ctx) {
		hist.Record(ctx, time.Since(started).Seconds())
	}
	failures := broker.Failures(len(msgs), pubErr)
	endPublishSpans(spans, failures)
	return failures, pubErr
}

// publishSingles publishes recs, which are in write order, and returns the
// broker's verdict on each.
func (r *Relay) publishSingles(ctx context.Context, recs []Record) *verdict {
	if len(recs) == 0 {
		return nil
	}
	// Claims are ordered by seq, and so are the messages: events sharing a
	// key reach the publisher in write order.
	failures, pubErr := r.send(ctx, recs)
	v := &verdict{firstSeq: recs[0].Seq}
	for i, rec := range recs {
		if failures[i] == nil {
			v.published = append(v.published, rec.ID)
			continue
		}
		v.failed = append(v.failed, rec.ID)
		v.errs = append(v.errs, failures[i].Error())
		v.delays = append(v.delays, r.cfg.Backoff.Delay(rec.Attempts, nil).Milliseconds())
	}
	if len(v.failed) > 0 {
		r.cfg.Logger.Warn("llmq: outbox events not confirmed; they will be retried", "failed", len(v.failed), "of", len(recs), "err", pubErr)
	}
	return v
}

// claim records carried, then claims up to a batch with seq in [floor,
// ceiling), fenced by the lease epoch (0: unfenced), in one transaction
// whose statements are sent together. The claims' advisory lock comes
// first (see LockClaims: a verdict's row locks are never held while
// waiting for it), then the verdict, so the claim sees the keys it frees
// (a key's next event is claimable once its previous one is marked
// published). The records come back in write order. The verdict includes
// what earlier verdicts could not record (see below).
//
// The claim and the verdict are lock-free (ClaimEvents, MarkPublished)
// and wait at most claimLockTimeout for an event's row. When that passes,
// some other session holds an unpublished event (a verdict does for
// milliseconds; an operator's open transaction may for hours), and the
// transaction is made again, and for skipLockedFor after it, skipping
// locked rows (ClaimEventsSkippingLocked, MarkPublishedSkippingLocked),
// which steps over that event as claims always did. A verdict on a held
// event is kept and recorded by a later transaction of this relay, once
// the row is free: it never waits in the claims' lock, and nothing the
// broker confirmed is lost (at worst, if the relay stops first or its
// claim passes to another relay, the event is published again).
//
// With c.releaseOwn, the relay's own claims are released after the
// verdicts and before the claim (ReleaseOwnClaims): only when none of them
// is in flight.
//
// When claim fails, carried is not recorded and stays the caller's.
func (r *Relay) claim(ctx context.Context, carried *verdict, c *claimRange) (claimed, error) {
	return r.transact(ctx, carried, c)
}

// claimRange is what a claim claims: seq in [floor, ceiling), fenced by
// epoch; releaseOwn releases the relay's own claims first.
type claimRange struct {
	floor, ceiling, epoch int64
	releaseOwn            bool
}

// transact records carried and the verdicts kept from before, and then
// claims c unless c is nil, as claim describes.
func (r *Relay) transact(ctx context.Context, carried *verdict, c *claimRange) (claimed, error) {
	held := r.takeHeld()
	v := carried.merge(held)
	skipLocked := time.Now().UnixNano() < r.skipLockedUntil.Load()
	got, skipped, err := r.transactWith(ctx, v, c, skipLocked)
	var pgErr *pgconn.PgError
	if !skipLocked && errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		r.skipLockedUntil.Store(time.Now().Add(skipLockedFor).UnixNano())
		r.cfg.Logger.InfoContext(ctx, "llmq: outbox claim waited for a row another session holds; skipping locked rows for a while",
			"for", skipLockedFor)
		got, skipped, err = r.transactWith(ctx, v, c, true)
	}
	if err != nil {
		r.keepHeld(held) // carried stays the caller's
		return claimed{}, err
	}
	r.keepHeld(v.only(skipped))
	r.recorded(ctx, v.without(skipped))
	return got, nil
}

// How long a lock-free claim waits for an event's row, and how long the
// claims after one that waited too long skip locked rows instead.
const (
	claimLockTimeout = 200 * time.Millisecond
	skipLockedFor    = time.Minute
)

// transactWith is transact, lock-free under the lock timeout, or skipping
// locked rows; it returns the claimed records and the events of v whose
// verdict was not recorded because another session held their rows.
// Every statement after the claims' lock runs under the lock timeout,
// also those that skip locked rows, so nothing in this transaction waits
// long for a row while it holds the claims' lock.
func (r *Relay) transactWith(ctx context.Context, v *verdict, c *claimRange, skipLocked bool) (claimed, skippedSet, error) {
	var (
		recs      []Record
		batchRows []claimedBatchRow
	)
	skipped := newSkippedSet()
	batch := &pgx.Batch{}
	// A verdict on batch rows is recorded in the claims' lock too, also
	// outside a claim: it may split events out of a row into single-event
	// rows, and a claim whose snapshot missed those copies could take a
	// later batch row of their keys (one whose earlier row's claim had
	// expired) without seeing them hold it back.
	if c != nil || v.hasBatches() {
		batch.Queue(r.store.sql.lockClaims, r.lockID, r.idleTimeoutMS())
	}
	batch.Queue(r.store.sql.claimLockTimeout, r.lockTimeout.Milliseconds())
	r.queueVerdict(batch, v, skipLocked, skipped)
	if c != nil && c.releaseOwn {
		r.queueReleaseOwn(ctx, batch)
	}
	if c != nil {
		r.queueClaim(batch, c, skipLocked, &recs, &batchRows)
	}
	// The batch is the whole transaction, in one round trip: statements
	// sent together up to one Sync run as one implicit transaction (a
	// simple-protocol batch is one multi-statement query, which is one
	// too), which commits at the Sync, or rolls back whole at the first
	// error. BEGIN and COMMIT of their own would cost two more round trips
	// per claim, each one more wait for a core on a busy machine (see the
	// package documentation, Round trips).
	if err := r.pool.SendBatch(ctx, batch).Close(); err != nil {
		return claimed{}, skippedSet{}, err
	}
	return r.claimedFrom(ctx, recs, batchRows), skipped, nil
}

// queueReleaseOwn adds ReleaseOwnClaims to b (see claim).
func (r *Relay) queueReleaseOwn(ctx context.Context, b *pgx.Batch) {
	b.Queue(r.store.sql.releaseOwnClaims, r.cfg.ID).QueryRow(func(row pgx.Row) error {
		var released int64
		if err := row.Scan(&released); err != nil {
			return err
		}
		if released > 0 {
			r.cfg.Logger.InfoContext(ctx, "llmq: outbox relay released the claims a lost connection left; their events are published again", "events", released)
		}
		return nil
	})
}

// queueClaim adds the claim of c to b, which scans what it took into recs
// and batchRows.
func (r *Relay) queueClaim(b *pgx.Batch, c *claimRange, skipLocked bool, recs *[]Record, batchRows *[]claimedBatchRow) {
	claimEvents, claimBatches := r.store.sql.claimEvents, r.store.sql.claimBatches
	if skipLocked {
		claimEvents, claimBatches = r.store.sql.claimEventsSkippingLocked, r.store.sql.claimBatchSkippingLocked
	}
	b.Queue(claimEvents, r.cfg.BatchSize, r.cfg.ID, r.cfg.ClaimLease.Milliseconds(), c.floor, c.ceiling, c.epoch).
		Query(func(rows pgx.Rows) error {
			var err error
			*recs, err = pgx.CollectRows(rows, scanClaimed)
			return err
		})
	// After the single-event rows, so that one claimed here holds back its
	// key's events in the batch rows (see ClaimBatches).
	b.Queue(claimBatches, r.cfg.ID, r.cfg.ClaimLease.Milliseconds(), c.epoch, r.cfg.BatchSize).
		Query(func(rows pgx.Rows) error {
			var err error
			*batchRows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimedBatchRow, error) {
				var b claimedBatchRow
				return b, row.Scan(b.dest()...)
			})
			return err
		})
}

// claimedFrom is what a committed claim took, in write order.
func (r *Relay) claimedFrom(ctx context.Context, recs []Record, batchRows []claimedBatchRow) claimed {
	// UPDATE ... RETURNING has no order: restore write order, which the
	// messages of one key must keep.
	slices.SortFunc(recs, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
	got := claimed{recs: recs}
	slices.SortFunc(batchRows, func(a, b claimedBatchRow) int { return cmp.Compare(a.firstSeq, b.firstSeq) })
	for _, row := range batchRows {
		// The claim is committed, so what it took is published whatever a
		// row holds. A row this build cannot read (only SQL written by
		// hand makes one) stays claimed, unpublished, and with it every
		// batch row after it: it is logged, and the single-event rows and
		// the rows before it go on.
		b, err := scanClaimedBatch(row)
		if err != nil {
			r.cfg.Logger.ErrorContext(ctx, "llmq: outbox batch row cannot be read; it and the batch rows after it wait until it is repaired or deleted",
				"first_seq", row.firstSeq, "err", err)
			break
		}
		got.batches = append(got.batches, b)
	}
	return got
}

// settle records v, and the verdicts kept from before, in a transaction
// of its own. It runs even if ctx has ended: what the broker confirmed
// must be marked, or it is published again. Like a claim's, it waits at
// most the lock timeout for a row, and keeps the verdict on an event whose
// row another session holds for a later transaction.
func (r *Relay) settle(ctx context.Context, v *verdict) error {
	if v.empty() && r.heldEmpty() {
		return nil
	}
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ClaimLease)
	defer cancel()
	if _, err := r.transact(settleCtx, v, nil); err != nil {
		if dberr.Connection(err) {
			// The verdict is still true and still this relay's to record:
			// the next transaction records it first (see claim), while the
			// claim is this relay's, rather than have its events published
			// again.
			r.keepHeld(v)
		}
		res := v.result()
		return fmt.Errorf("outbox: recording %d publications and %d failures: %w", res.Published, res.Failed, err)
	}
	return nil
}

// heldEmpty reports whether no verdict is kept for later.
func (r *Relay) heldEmpty() bool {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	return r.held.empty()
}

// recorded counts a verdict once it is durable.
func (r *Relay) recorded(ctx context.Context, v *verdict) {
	if v == nil {
		return
	}
	res := v.result()
	r.published.Add(int64(res.Published))
	r.failed.Add(int64(res.Failed))
	if r.obs.events.Enabled(ctx) {
		if res.Published > 0 {
			r.obs.events.Add(ctx, int64(res.Published), metric.WithAttributeSet(r.obs.published))
		}
		if res.Failed > 0 {
			r.obs.events.Add(ctx, int64(res.Failed), metric.WithAttributeSet(r.obs.failed))
		}
	}
}

func scanClaimed(row pgx.CollectableRow) (Record, error) {
	var c claimedRow
	if err := row.Scan(c.dest()...); err != nil {
		return c.r, err
	}
	r := c.r
	r.AggregateID, r.Key = dbsql.Deref(c.aggregate), dbsql.Deref(c.key)
	return r, json.Unmarshal(c.headers, &r.Headers)
}

func toMessage(rec Record) broker.Message {
	headers := make(map[string]string, len(rec.Headers)+3)
	for k, v := range rec.Headers {
		headers[k] = v
	}
	headers[HeaderEventID] = rec.ID.String()
	headers[HeaderEventType] = rec.Type
	if rec.AggregateID != uuid.Nil {
		headers[HeaderAggregateID] = rec.AggregateID.String()
	}
	return broker.Message{ID: rec.ID.String(), Topic: rec.Topic, Key: rec.Key, Headers: headers, Body: rec.Payload}
}

// Stats is the relay's view of the outbox.
type Stats struct {
	// Pending is the number of unpublished events, and OldestPending the
	// age of the oldest: the publication lag.
	Pending       int64
	OldestPending time.Duration
	// Published and Failed count this relay's publications since it was
	// built.
	Published, Failed int64
}

// Stats reads the unpublished backlog and this relay's counters.
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Published: r.published.Load(), Failed: r.failed.Load()}
	var ageSeconds float64
	if err := r.pool.QueryRow(ctx, r.store.sql.pendingStats).Scan(&st.Pending, &ageSeconds); err != nil {
		return st, fmt.Errorf("outbox: reading the backlog: %w", r.store.explain(err))
	}
	st.OldestPending = time.Duration(ageSeconds * float64(time.Second))
	return st, nil
}

// Prune deletes events published more than Retention ago, in batches, and
// returns how many.
func (r *Relay) Prune(ctx context.Context) (int64, error) {
	const batch = 10_000
	var total int64
	for {
		var (
			n    int64
			more bool // a limit was reached (see PrunePublished)
		)
		if err := r.pool.QueryRow(ctx, r.store.sql.prunePublished, r.cfg.Retention.Milliseconds(), batch).Scan(&n, &more); err != nil {
			return total, fmt.Errorf("outbox: pruning: %w", r.store.explain(err))
		}
		total += n
		if !more {
			return total, nil
		}
	}
}
