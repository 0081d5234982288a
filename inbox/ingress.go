package inbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/internal/validate"
)

// ErrMalformed marks a message its handler cannot decode or use: it is
// quarantined and rejected (dead-lettered), never redelivered. Wrap a
// handler's error with Malformed to say so.
var ErrMalformed = errors.New("inbox: malformed message")

// Malformed marks err as a malformed-message error.
func Malformed(err error) error { return fmt.Errorf("%w: %w", ErrMalformed, err) }

// Handler does a message's work in tx, the transaction that records the
// message in the inbox. Returning an error rolls both back; the message is
// then redelivered, unless the error is ErrMalformed.
type Handler func(ctx context.Context, tx pgx.Tx, msg broker.Message) error

// Ingress batching defaults and limits.
const (
	DefaultIngressBatch  = 100
	MaxIngressBatch      = 10_000
	DefaultIngressLinger = 2 * time.Millisecond
)

// IngressConfig configures an Ingress. Zero values mean the documented
// defaults.
type IngressConfig struct {
	// Consumer is the inbox consumer name the messages are recorded under.
	// Required.
	Consumer string
	// Handler does each new message's work. Required.
	Handler Handler
	// MaxBatch is the most deliveries one transaction takes. Default 100,
	// at most 10,000; 1 handles each delivery in its own transaction. Keep
	// Concurrency·MaxBatch within the consumer's prefetch, or batches wait
	// out Linger for deliveries the broker will not send.
	MaxBatch int
	// Linger is how long a batch, once it has its first delivery, waits for
	// more before it is processed. Default 2ms.
	Linger time.Duration
	// Concurrency is how many batches Run processes at once, each in its own
	// transaction. Default 1, which keeps delivery order; more trades order
	// for throughput.
	Concurrency int
	// Logger receives operational messages. Default: discard.
	Logger *slog.Logger
	// MeterProvider receives llmq.inbox.messages. Nil means none.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a consumer span per delivery, continuing the
	// trace in the message's headers; the handler runs in it. Nil means
	// none.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from a message's headers. Default:
	// W3C TraceContext (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// Ingress takes deliveries from a broker.Consumer into the database. It
// takes a batch of deliveries (those already available, up to MaxBatch,
// waiting at most Linger after the first), accepts and handles each in a
// savepoint of its own inside one transaction, commits once, and only then
// settles each delivery:
//
//   - New message: handled, committed, acknowledged.
//   - Duplicate (a redelivery of a committed message): acknowledged without
//     calling the handler again.
//   - No id, ErrMalformed from the handler, or an id reused with another
//     payload: quarantined (the quarantine row commits with the batch) and
//     rejected (dead-lettered); the loop goes on.
//   - Any other handler or database error: that message's savepoint is
//     rolled back and it is nacked, so the broker redelivers it; the
//     batch's other messages are unaffected.
//   - The commit fails: every delivery of the batch is nacked.
//
// One bad message never poisons its batch: its savepoint is rolled back
// alone. Messages of a batch are handled in delivery order, and with
// Concurrency 1 batches are too.
type Ingress struct {
	store    *Store
	db       dbsql.Beginner
	consumer broker.Consumer
	cfg      IngressConfig
	obs      *ingressInstruments
}

// NewIngress validates cfg and returns an ingress reading from consumer
// into db (a pool).
func (s *Store) NewIngress(db dbsql.Beginner, consumer broker.Consumer, cfg IngressConfig) (*Ingress, error) {
	switch {
	case db == nil || consumer == nil:
		return nil, errors.New("inbox: NewIngress needs a database and a consumer")
	case cfg.Handler == nil:
		return nil, errors.New("inbox: IngressConfig.Handler is required")
	case cfg.MaxBatch < 0 || cfg.MaxBatch > MaxIngressBatch:
		return nil, fmt.Errorf("inbox: IngressConfig.MaxBatch is %d; use 0 for the default of %d, or 1 to %d", cfg.MaxBatch, DefaultIngressBatch, MaxIngressBatch)
	case cfg.Linger < 0 || cfg.Concurrency < 0:
		return nil, errors.New("inbox: IngressConfig.Linger and Concurrency must not be negative")
	}
	if p := validate.Text(cfg.Consumer, true, MaxConsumerLen); p != "" {
		return nil, fmt.Errorf("inbox: IngressConfig.Consumer %s", p)
	}
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, DefaultIngressBatch)
	cfg.Linger = cmp.Or(cfg.Linger, DefaultIngressLinger)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	obs, err := newIngressInstruments(cfg)
	if err != nil {
		return nil, fmt.Errorf("inbox: ingress instruments: %w", err)
	}
	return &Ingress{store: s, db: db, consumer: consumer, cfg: cfg, obs: obs}, nil
}

// Run handles deliveries until ctx ends or the consumer is closed.
func (in *Ingress) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range in.cfg.Concurrency {
		wg.Go(func() { in.loop(ctx) })
	}
	wg.Wait()
	return nil
}

func (in *Ingress) loop(ctx context.Context) {
	for {
		batch, err := in.collect(ctx)
		if len(batch) > 0 {
			for i, err := range in.handleBatch(ctx, batch) {
				in.log(ctx, batch[i], err)
			}
		}
		if stopped(ctx, err) {
			return // a shutdown, not a failure
		}
		if err != nil {
			in.cfg.Logger.Warn("llmq: receive failed", "consumer", in.cfg.Consumer, "err", err)
			if !retry.Sleep(ctx, 200*time.Millisecond) {
				return
			}
		}
	}
}

// collect receives one delivery, then those that arrive within Linger, up
// to MaxBatch. It returns the error that ended the first receive, or the
// consumer's closing after some were taken.
func (in *Ingress) collect(ctx context.Context) ([]broker.Delivery, error) {
	first, err := in.consumer.Receive(ctx)
	if err != nil {
		return nil, err
	}
	batch := []broker.Delivery{first}
	if in.cfg.MaxBatch == 1 {
		return batch, nil
	}
	lingerCtx, cancel := context.WithTimeout(ctx, in.cfg.Linger)
	defer cancel()
	for len(batch) < in.cfg.MaxBatch {
		d, err := in.consumer.Receive(lingerCtx)
		if err != nil {
			if errors.Is(err, broker.ErrClosed) {
				return batch, err
			}
			break // lingered long enough (or ctx ended: handled by the caller)
		}
		batch = append(batch, d)
	}
	return batch, nil
}

func (in *Ingress) log(ctx context.Context, d broker.Delivery, err error) {
	switch {
	case err == nil, ctx.Err() != nil:
	case errors.Is(err, ErrMalformed), errors.Is(err, ErrDigestMismatch):
		in.cfg.Logger.Error("llmq: message quarantined and rejected", "consumer", in.cfg.Consumer, "message", d.Message().ID, "err", err)
	default:
		in.cfg.Logger.Warn("llmq: delivery not accepted; it will be redelivered", "consumer", in.cfg.Consumer, "message", d.Message().ID, "err", err)
	}
}

// Handle processes one delivery as Run does, in a transaction of its own,
// and returns why it was not accepted, if it was not.
func (in *Ingress) Handle(ctx context.Context, d broker.Delivery) error {
	return in.handleBatch(ctx, []broker.Delivery{d})[0]
}

// verdict is what becomes of one delivery once its batch committed.
type verdict struct {
	settle func(ctx context.Context, d broker.Delivery) error
	err    error  // why it was not accepted
	result string // for llmq.inbox.messages
}

func ack(ctx context.Context, d broker.Delivery) error { return d.Ack(ctx) }

func nack(ctx context.Context, d broker.Delivery) error { return d.Nack(ctx) }

func reject(reason error) verdict {
	return verdict{settle: func(ctx context.Context, d broker.Delivery) error { return d.Reject(ctx, reason) }, err: reason,
		result: resultQuarantined}
}

func acceptNew() verdict { return verdict{settle: ack, result: resultAccepted} }

func acceptDuplicate() verdict { return verdict{settle: ack, result: resultDuplicate} }

func retryLater(err error) verdict { return verdict{settle: nack, err: err, result: resultFailed} }

// handleBatch processes batch in one transaction, then settles each
// delivery and returns why each was not accepted.
//
// It first tries the batch whole: one statement records every id, the
// handlers run directly in the transaction. Only if that fails (a handler
// or the database returned an error) is it rolled back and redone with a
// savepoint per message, so that the failure stays with its message. A
// handler may therefore run twice for one message, the first time in a
// transaction that rolled back, as after any rollback and redelivery.
func (in *Ingress) handleBatch(ctx context.Context, batch []broker.Delivery) []error {
	var (
		verdicts []verdict
		err      error
	)
	spans := in.startSpans(ctx, batch)
	whole := len(batch) > 1
	if whole {
		verdicts, err = in.wholeBatch(ctx, spans, batch)
	}
	if !whole || err != nil && ctx.Err() == nil {
		verdicts = make([]verdict, len(batch))
		err = dbsql.WithTx(ctx, in.db, func(tx pgx.Tx) error {
			for i, d := range batch {
				verdicts[i] = in.process(inSpan(ctx, spans, i), tx, d)
			}
			return nil
		})
	}
	// Settle even if ctx ended meanwhile: what committed should not be
	// delivered again for want of an ack.
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	results := make([]string, len(batch))
	for i, d := range batch {
		var v verdict
		if err != nil {
			// Nothing committed: every delivery, quarantined ones included,
			// is redelivered and processed again.
			v = retryLater(err)
		} else {
			v = verdicts[i]
		}
		// Committed: only now may the broker forget the message.
		errs[i], results[i] = errors.Join(v.err, v.settle(settleCtx, d)), v.result
	}
	in.report(settleCtx, results, errs, spans)
	return errs
}

// wholeBatch processes batch in one transaction without savepoints, and
// fails (rolling everything back) at the first error.
func (in *Ingress) wholeBatch(ctx context.Context, spans []trace.Span, batch []broker.Delivery) ([]verdict, error) {
	verdicts := make([]verdict, len(batch))
	err := dbsql.WithTx(ctx, in.db, func(tx pgx.Tx) error {
		results, err := in.store.acceptMany(ctx, tx, in.cfg.Consumer, batch)
		if err != nil {
			return err
		}
		for i, d := range batch {
			msg := d.Message()
			switch r := results[i]; {
			case msg.ID == "":
				if _, err := in.store.Quarantine(ctx, tx, in.cfg.Consumer, msg, d.Source(), noIDReason); err != nil {
					return err
				}
				verdicts[i] = reject(fmt.Errorf("%w: %s", ErrMalformed, noIDReason))
			case r.mismatch != nil:
				verdicts[i] = reject(r.mismatch)
			case r.result == Duplicate:
				verdicts[i] = acceptDuplicate()
			default:
				if err := in.cfg.Handler(inSpan(ctx, spans, i), tx, msg); err != nil {
					return err
				}
				verdicts[i] = acceptNew()
			}
		}
		return nil
	})
	return verdicts, err
}

const (
	noIDReason    = "the message has no id"
	settleTimeout = 10 * time.Second
)

// accepted is acceptMany's verdict on one message.
type accepted struct {
	result   Result
	mismatch error // ErrDigestMismatch, after a quarantine row was written
}

// acceptMany is Accept for a batch of deliveries in two statements (plus a
// quarantine row per reused id). Deliveries without an id are left to the
// caller; any other invalid id fails the whole batch.
func (s *Store) acceptMany(ctx context.Context, tx pgx.Tx, consumer string, batch []broker.Delivery) ([]accepted, error) {
	ids := make([]string, 0, len(batch))
	digests := make([]string, 0, len(batch))
	sources := make([]string, 0, len(batch))
	for _, d := range batch {
		msg := d.Message()
		if msg.ID == "" {
			continue
		}
		if p := validate.Text(msg.ID, true, MaxMessageIDLen); p != "" {
			return nil, &ValidationError{Kind: ErrInvalidMessage, Field: "Message.ID", Problem: p}
		}
		src, err := json.Marshal(d.Source())
		if err != nil {
			return nil, err
		}
		ids, digests, sources = append(ids, msg.ID), append(digests, Digest(msg.Body)), append(sources, string(src))
	}
	rows, err := tx.Query(ctx, s.sql.insertMany, consumer, ids, digests, sources)
	if err != nil {
		return nil, fmt.Errorf("inbox: accepting %d messages for %s: %w", len(ids), consumer, err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: accepting %d messages for %s: %w", len(ids), consumer, err)
	}
	// Each id's digest as recorded: by this batch (its first occurrence) or
	// by an earlier, committed transaction.
	recorded := make(map[string]string, len(ids))
	isNew := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		isNew[id] = true
	}
	var older []string
	for i, id := range ids {
		switch _, seen := recorded[id]; {
		case seen:
		case isNew[id]:
			recorded[id] = digests[i]
		default:
			recorded[id] = ""
			older = append(older, id)
		}
	}
	if len(older) > 0 {
		rows, err := tx.Query(ctx, s.sql.selectMany, consumer, older)
		if err != nil {
			return nil, fmt.Errorf("inbox: reading %d messages for %s: %w", len(older), consumer, err)
		}
		found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
			var r [2]string
			return r, row.Scan(&r[0], &r[1])
		})
		if err != nil {
			return nil, fmt.Errorf("inbox: reading %d messages for %s: %w", len(older), consumer, err)
		}
		for _, r := range found {
			recorded[r[0]] = r[1]
		}
	}
	out := make([]accepted, len(batch))
	for i, d := range batch {
		msg := d.Message()
		if msg.ID == "" {
			continue
		}
		existing := recorded[msg.ID]
		switch {
		case isNew[msg.ID]:
			out[i].result = New
			delete(isNew, msg.ID) // a second copy in this batch is a duplicate
		case existing == Digest(msg.Body):
			out[i].result = Duplicate
		default:
			out[i].mismatch = s.quarantineMismatch(ctx, tx, consumer, msg, d.Source(), existing)
			if !errors.Is(out[i].mismatch, ErrDigestMismatch) {
				return nil, out[i].mismatch
			}
		}
	}
	return out, nil
}

// process accepts and handles one delivery in a savepoint of tx.
func (in *Ingress) process(ctx context.Context, tx pgx.Tx, d broker.Delivery) verdict {
	msg, source := d.Message(), d.Source()
	if msg.ID == "" {
		return in.quarantine(ctx, tx, d, noIDReason)
	}
	var mismatch error
	dup := false
	err := dbsql.WithTx(ctx, tx, func(sp pgx.Tx) error {
		res, err := in.store.Accept(ctx, sp, in.cfg.Consumer, msg, source)
		switch {
		case errors.Is(err, ErrDigestMismatch):
			mismatch = err
			return nil // keep the quarantine row Accept wrote
		case err != nil:
			return err
		case res == Duplicate:
			dup = true
			return nil
		}
		return in.cfg.Handler(ctx, sp, msg)
	})
	switch {
	case mismatch != nil:
		return reject(mismatch)
	case errors.Is(err, ErrMalformed):
		return in.quarantine(ctx, tx, d, err.Error())
	case err != nil:
		return retryLater(err)
	case dup:
		return acceptDuplicate()
	}
	return acceptNew()
}

func (in *Ingress) quarantine(ctx context.Context, tx pgx.Tx, d broker.Delivery, reason string) verdict {
	err := dbsql.WithTx(ctx, tx, func(sp pgx.Tx) error {
		_, err := in.store.Quarantine(ctx, sp, in.cfg.Consumer, d.Message(), d.Source(), reason)
		return err
	})
	if err != nil {
		return retryLater(err)
	}
	return reject(fmt.Errorf("%w: %s", ErrMalformed, reason))
}

// stopped reports whether a Receive ended because Run should end.
func stopped(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, broker.ErrClosed)
}
