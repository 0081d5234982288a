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
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/pglisten"
	"github.com/llmq/llmq/internal/retry"
)

// Headers every relayed message carries besides the event's own.
const (
	HeaderEventID     = "llmq-event-id"
	HeaderEventType   = "llmq-event-type"
	HeaderAggregateID = "llmq-aggregate-id"
)

// BackoffPolicy is the full-jitter backoff of an event whose publication
// failed.
type BackoffPolicy = retry.Policy

// RelayConfig configures a Relay. Zero values mean the documented defaults.
type RelayConfig struct {
	// ID names this relay on the events it claims. Default: host name,
	// process id and a random suffix.
	ID string
	// BatchSize is the most events one claim takes. Default 100, at most
	// 1000.
	BatchSize int
	// ClaimLease is how long a claim holds its events. A relay that dies
	// mid-batch leaves them to be reclaimed this long after its claim.
	// Default 30s.
	ClaimLease time.Duration
	// PollInterval is the fallback claim interval when no NOTIFY arrives.
	// Default 500ms.
	PollInterval time.Duration
	// Backoff delays an event after a failed publication. Default base 1s,
	// cap 60s.
	Backoff BackoffPolicy
	// Retention is how long published events stay before the pruner
	// deletes them. Default 24h.
	Retention time.Duration
	// PruneInterval is how often Run prunes. Default 1 minute.
	PruneInterval time.Duration
	// Logger receives operational messages. Default: discard.
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

	published, failed atomic.Int64
	obs               *relayInstruments
}

// NewRelay validates cfg and returns a relay for the store's outbox.
func (s *Store) NewRelay(pool *pgxpool.Pool, pub broker.Publisher, cfg RelayConfig) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a publisher")
	}
	for name, d := range map[string]time.Duration{
		"ClaimLease": cfg.ClaimLease, "PollInterval": cfg.PollInterval,
		"Retention": cfg.Retention, "PruneInterval": cfg.PruneInterval, "GaugeRefresh": cfg.GaugeRefresh,
	} {
		if d < 0 {
			return nil, fmt.Errorf("outbox: relay %s is %s; use 0 for the default or a positive duration", name, d)
		}
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > 1000 {
		return nil, fmt.Errorf("outbox: relay BatchSize is %d; use 0 for the default or 1 to 1000", cfg.BatchSize)
	}
	if err := cfg.Backoff.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: relay Backoff: %w", err)
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 100)
	cfg.ClaimLease = cmp.Or(cfg.ClaimLease, 30*time.Second)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 500*time.Millisecond)
	cfg.Backoff = BackoffPolicy{Base: cmp.Or(cfg.Backoff.Base, time.Second), Cap: cmp.Or(cfg.Backoff.Cap, time.Minute)}
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
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	obs, err := newRelayInstruments(cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay instruments: %w", err)
	}
	return &Relay{store: s, pool: pool, pub: pub, cfg: cfg, obs: obs, lockID: "llmq.outbox.claim:" + s.schema.Name()}, nil
}

// defaultGaugeRefresh is RelayConfig.GaugeRefresh's default.
const defaultGaugeRefresh = 15 * time.Second

// BatchResult counts what one RelayOnce did.
type BatchResult struct {
	Claimed, Published, Failed int
}

// RelayOnce claims one batch, publishes it and records the broker's
// verdict on each event. Nothing is held open while publishing: the claim
// is its own short transaction.
func (r *Relay) RelayOnce(ctx context.Context) (BatchResult, error) {
	var recs []Record
	err := dbsql.WithTx(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, r.store.sql.lockClaims, r.lockID); err != nil {
			return err
		}
		floor := r.floor.Load()
		if time.Since(time.Unix(0, r.fullScans.Load())) >= time.Second {
			floor = 0
		}
		if floor == 0 {
			r.fullScans.Store(time.Now().UnixNano())
		}
		rows, err := tx.Query(ctx, r.store.sql.claimEvents, r.cfg.BatchSize, r.cfg.ID, r.cfg.ClaimLease.Milliseconds(), floor)
		if err != nil {
			return err
		}
		recs, err = pgx.CollectRows(rows, scanClaimed)
		return err
	})
	if err != nil {
		return BatchResult{}, fmt.Errorf("outbox: claiming events: %w", err)
	}
	// UPDATE ... RETURNING has no order: restore write order, which the
	// messages of one key must keep.
	slices.SortFunc(recs, func(a, b Record) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(recs) < r.cfg.BatchSize {
		r.floor.Store(0)
	} else {
		r.floor.Store(recs[0].Seq)
	}
	if len(recs) == 0 {
		return BatchResult{}, nil
	}
	// Claims are ordered by seq, and so are the messages: events sharing a
	// key reach the publisher in write order.
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

	res := BatchResult{Claimed: len(recs)}
	var published, failed [][16]byte
	var errs []string
	var delays []int64
	for i, rec := range recs {
		if failures[i] == nil {
			published = append(published, rec.ID)
			continue
		}
		failed = append(failed, rec.ID)
		errs = append(errs, failures[i].Error())
		delays = append(delays, r.cfg.Backoff.Delay(rec.Attempts, nil).Milliseconds())
	}
	res.Published, res.Failed = len(published), len(failed)
	// The verdict is recorded even if ctx ended while publishing: what the
	// broker confirmed must be marked, or it is published again.
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ClaimLease)
	defer cancel()
	// One transaction for both verdicts, its statements sent together; see
	// RelaxCommit in queries.sql for why it does not wait for its flush.
	err = dbsql.WithTx(settleCtx, r.pool, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue(r.store.sql.relaxCommit)
		if len(published) > 0 {
			batch.Queue(r.store.sql.markPublished, r.cfg.ID, published)
		}
		if len(failed) > 0 {
			batch.Queue(r.store.sql.markFailed, r.cfg.ID, failed, errs, delays)
		}
		return tx.SendBatch(settleCtx, batch).Close()
	})
	if err != nil {
		return res, fmt.Errorf("outbox: recording %d publications and %d failures: %w", len(published), len(failed), err)
	}
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
	if res.Failed > 0 {
		r.cfg.Logger.Warn("llmq: outbox events not confirmed; they will be retried", "failed", res.Failed, "of", res.Claimed, "err", pubErr)
	}
	return res, nil
}

func scanClaimed(row pgx.CollectableRow) (Record, error) {
	var (
		r         Record
		aggregate *uuid.UUID
		key       *string
		headers   []byte
	)
	err := row.Scan((*[16]byte)(&r.ID), &aggregate, &r.Topic, &key, &r.Type, &r.Payload, &headers, &r.Seq, &r.CreatedAt, &r.Attempts)
	if err != nil {
		return r, err
	}
	r.AggregateID, r.Key = dbsql.Deref(aggregate), dbsql.Deref(key)
	return r, json.Unmarshal(headers, &r.Headers)
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

// Run relays until ctx ends: it claims and publishes batches while there
// are events, then waits for a NOTIFY from a writer (outbox.Store.Write, or
// an enqueue on the job store's channel) or the poll interval, and prunes
// published events every PruneInterval. Several relays may run at once.
func (r *Relay) Run(ctx context.Context) error {
	if r.cfg.MeterProvider != nil {
		reg, err := r.registerGauges()
		if err != nil {
			return fmt.Errorf("outbox: relay gauges: %w", err)
		}
		defer func() { _ = reg.Unregister() }()
	}
	wake := make(chan struct{}, 1)
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		pglisten.Run(listenCtx, r.pool.Config().ConnConfig,
			[]string{r.store.channel, r.store.schema.Channel("jobs")},
			func(string, string) { signal() }, signal, r.cfg.Logger)
	}()
	defer func() { <-listening }()

	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	prune := time.NewTicker(r.cfg.PruneInterval)
	defer prune.Stop()
	backoff := time.Duration(0)
	for {
		res, err := r.RelayOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			backoff = min(max(2*backoff, 50*time.Millisecond), 5*time.Second)
			r.cfg.Logger.Warn("llmq: outbox relay pass failed", "err", err, "retry_in", backoff)
		case res.Claimed == r.cfg.BatchSize:
			backoff = 0
			continue // more are waiting
		default:
			backoff = 0
		}
		var retryAfter <-chan time.Time
		if backoff > 0 {
			retryAfter = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		case <-retryAfter:
		case <-prune.C:
			if _, err := r.Prune(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("llmq: outbox prune failed", "err", err)
			}
		}
	}
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
		return st, fmt.Errorf("outbox: reading the backlog: %w", err)
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
		tag, err := r.pool.Exec(ctx, r.store.sql.prunePublished, r.cfg.Retention.Milliseconds(), batch)
		if err != nil {
			return total, fmt.Errorf("outbox: pruning: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < batch {
			return total, nil
		}
	}
}
