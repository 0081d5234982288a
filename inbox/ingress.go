package inbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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
// then redelivered, unless the error is permanent (ErrMalformed, a
// *llmqtype.ValidationError) or the message failed IngressConfig.MaxAttempts
// times. A panic counts as a failure. So does returning nil after a
// statement in tx failed: the failure aborted the transaction, the
// handler's savepoint can be neither released nor rolled back, and the
// ingress logs it as a handler bug and redoes the batch without that
// message. Return every statement's error.
type Handler func(ctx context.Context, tx pgx.Tx, msg broker.Message) error

// ErrInvalidConfig is matched by every IngressConfig error NewIngress
// returns, each a *llmqtype.ValidationError naming the field.
var ErrInvalidConfig = errors.New("inbox: invalid ingress configuration")

// Ingress batching defaults and limits.
const (
	DefaultIngressBatch  = 100
	MaxIngressBatch      = 10_000
	DefaultIngressLinger = 2 * time.Millisecond
	DefaultMaxAttempts   = 20
	MaxMaxAttempts       = 10_000
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
	// Concurrency is how many batches the ingress processes at once, each
	// in its own transaction on one database connection, over all its Run
	// and Handle calls together: it is the ingress's connection budget.
	// Default 1, which keeps delivery order; more trades order for
	// throughput.
	Concurrency int
	// Tombstones says what becomes of a message with a null body, a Kafka
	// tombstone: QuarantineTombstones (the zero value and default),
	// SkipTombstones or HandleTombstones.
	Tombstones TombstonePolicy
	// MaxAttempts caps the failures of one message's handling: at the
	// MaxAttempts-th it is quarantined and rejected instead of nacked, so
	// a poison the ingress cannot recognise never blocks a partition or a
	// queue for good. Failures known to be transient (see Ingress) do not
	// count. Default 20, at most 10,000; 1 quarantines at the first
	// failure.
	MaxAttempts int
	// Logger receives warnings (a delivery nacked, a receive failed) and
	// errors (a message quarantined, a handler panicked). Default
	// slog.Default(), so that they are seen without configuration.
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
//   - A message that can never be accepted: quarantined (the quarantine
//     row commits with the batch) and rejected (dead-lettered) without
//     calling the handler. That is one without an id, with an id Accept
//     refuses (control characters, invalid UTF-8, over MaxMessageIDLen),
//     with a null body (a Kafka tombstone, unless IngressConfig.Tombstones
//     says to skip or handle them), with a header key or value that is not
//     valid UTF-8 or contains NUL, or with an id accepted before with
//     another payload (ErrDigestMismatch).
//   - The handler returns a permanent error (ErrMalformed, any
//     *llmqtype.ValidationError): quarantined and rejected.
//   - The handler fails in a way known to be transient (ErrTransient, the
//     database unreachable or shutting down, a serialization failure,
//     deadlock or lock timeout, a network peer unreachable, a prepared
//     statement the session lost behind a pooler): rolled back
//     and nacked, so the broker redelivers it, however often.
//   - The handler fails otherwise (any other error, a panic, a savepoint
//     it left unusable by ignoring a failed statement): rolled back and
//     nacked, and counted; at the MaxAttempts-th failure it is
//     quarantined and rejected instead, with ErrTooManyAttempts and the
//     last error as the reason. The count is kept by this ingress, in
//     memory, by message id: it starts again after a restart, and each
//     process of a group counts its own.
//   - The inbox's own statements fail, or the commit fails for a transient
//     reason: every delivery of the batch is nacked, none is counted. A
//     failure is counted once per delivery, when the delivery is settled:
//     a handling redone after a failed commit is not counted again.
//   - Any of these nacks on a message's last delivery, which a broker with
//     a delivery limit would end unrecorded (broker.LimitedDelivery): the
//     message is quarantined and rejected instead, with ErrDeliveryLimit,
//     the attempt and the last failure in the reason, in a transaction of
//     its own. If that fails too, it is nacked and an error logged.
//
// One bad message never poisons its batch: its savepoint is rolled back
// alone, and if the batch's commit fails for a reason of its own (a
// deferred constraint) each message is redone in its own transaction, so
// the failure stays with the message that caused it. A handler that leaves
// its savepoint unusable aborts the whole transaction, which is then
// redone without running that handler again. Messages of a batch
// are handled in delivery order, and with Concurrency 1 batches are too.
//
// Connections: an ingress holds no database connection while it waits for
// deliveries, and uses at most Concurrency connections at once, one per
// batch in flight, however many goroutines call Run or Handle and however
// many deliveries the consumer prefetches.
type Ingress struct {
	store    *Store
	db       dbsql.Beginner
	consumer broker.Consumer
	cfg      IngressConfig
	obs      *ingressInstruments
	conns    chan struct{} // a slot per batch in flight: the connection budget
	failures *failureCounts
	// unrejected are quarantined deliveries whose Reject failed.
	unrejected *unrejectedSet
	// settleTimeout bounds each delivery's settle (settleTimeout; tests
	// shorten it).
	settleTimeout time.Duration
}

// NewIngress validates cfg and returns an ingress reading from consumer
// into db (a *pgxpool.Pool; each batch runs in a transaction of its own).
// A bad field of cfg is a *llmqtype.ValidationError matching
// ErrInvalidConfig.
func (s *Store) NewIngress(db DBTX, consumer broker.Consumer, cfg IngressConfig) (*Ingress, error) {
	if db == nil || consumer == nil {
		return nil, errors.New("inbox: NewIngress needs a database and a consumer")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, DefaultIngressBatch)
	cfg.Linger = cmp.Or(cfg.Linger, DefaultIngressLinger)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 1)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	obs, err := newIngressInstruments(cfg)
	if err != nil {
		return nil, fmt.Errorf("inbox: ingress instruments: %w", err)
	}
	return &Ingress{store: s, db: db, consumer: consumer, cfg: cfg, obs: obs,
		conns: make(chan struct{}, cfg.Concurrency), failures: newFailureCounts(), unrejected: newUnrejectedSet(),
		settleTimeout: settleTimeout}, nil
}

// validate reports the first field of cfg that is wrong, as a
// *llmqtype.ValidationError matching ErrInvalidConfig.
func (cfg IngressConfig) validate() error {
	problem := func(field, p string) error {
		return &validate.Error{Kind: ErrInvalidConfig, Field: "IngressConfig." + field, Problem: p}
	}
	switch {
	case cfg.Handler == nil:
		return problem("Handler", "is required")
	case cfg.MaxBatch < 0 || cfg.MaxBatch > MaxIngressBatch:
		return problem("MaxBatch", fmt.Sprintf("is %d; use 0 for the default of %d, or 1 to %d", cfg.MaxBatch, DefaultIngressBatch, MaxIngressBatch))
	case cfg.MaxAttempts < 0 || cfg.MaxAttempts > MaxMaxAttempts:
		return problem("MaxAttempts", fmt.Sprintf("is %d; use 0 for the default of %d, or 1 to %d", cfg.MaxAttempts, DefaultMaxAttempts, MaxMaxAttempts))
	case cfg.Linger < 0:
		return problem("Linger", "must not be negative")
	case cfg.Concurrency < 0:
		return problem("Concurrency", "must not be negative")
	case !cfg.Tombstones.valid():
		return problem("Tombstones", fmt.Sprintf("is %d; use QuarantineTombstones (the default), SkipTombstones or HandleTombstones", int(cfg.Tombstones)))
	}
	if p := validate.Text(cfg.Consumer, true, MaxConsumerLen); p != "" {
		return problem("Consumer", p)
	}
	return nil
}

// Run handles deliveries until ctx ends or the consumer is closed. It runs
// Concurrency loops; calling Run more than once adds loops, which share
// the same Concurrency connection slots. When ctx ends, a batch whose
// handlers have returned still commits and is settled (each delivery
// within 10s of its own) before Run returns; one whose handlers were
// interrupted rolls back and is nacked.
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
	case err == nil:
	case errors.Is(err, errUnrecordedLastDelivery):
		// Logged even while stopping: nothing else records the message.
		in.cfg.Logger.Error("llmq: message dead-lettered by the broker without a quarantine row", "consumer", in.cfg.Consumer, "message", d.Message().ID, "source", d.Source(), "err", err)
	case errors.Is(err, ErrDeliveryLimit):
		in.cfg.Logger.Error("llmq: message quarantined and rejected", "consumer", in.cfg.Consumer, "message", d.Message().ID, "source", d.Source(), "err", err)
	case ctx.Err() != nil:
	case errors.Is(err, ErrMalformed), errors.Is(err, ErrDigestMismatch), errors.Is(err, ErrTooManyAttempts):
		in.cfg.Logger.Error("llmq: message quarantined and rejected", "consumer", in.cfg.Consumer, "message", d.Message().ID, "source", d.Source(), "err", err)
	default:
		in.cfg.Logger.Warn("llmq: delivery not accepted; it will be redelivered", "consumer", in.cfg.Consumer, "message", d.Message().ID, "source", d.Source(), "err", err)
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
	// countsAsFailure says the delivery is nacked for a failure that
	// counts toward MaxAttempts. It is counted when the delivery is
	// settled, once the batch's outcome is known, so that a handling
	// redone after a failed commit, or one whose transaction never
	// committed, is not counted twice.
	countsAsFailure bool
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

// handleBatch processes batch, then settles each delivery and returns why
// each was not accepted.
func (in *Ingress) handleBatch(ctx context.Context, batch []broker.Delivery) []error {
	spans := in.startSpans(ctx, batch)
	verdicts := in.decideSkipping(ctx, spans, batch)
	in.settleLastDeliveries(ctx, batch, verdicts)
	// Settle even if ctx ended meanwhile: what committed should not be
	// delivered again for want of an ack. Each delivery has a deadline of
	// its own: a slow settle (a Kafka Reject's dead-letter produce) must
	// not use up the next one's.
	settleBase := context.WithoutCancel(ctx)
	errs := make([]error, len(batch))
	results := make([]string, len(batch))
	for i, d := range batch {
		v := verdicts[i]
		switch {
		case v.result != resultFailed:
			in.failures.forget(d.Message().ID) // settled for good
		case v.countsAsFailure:
			in.failures.add(d.Message().ID)
		}
		// Committed: only now may the broker forget the message.
		settleCtx, cancel := context.WithTimeout(settleBase, in.settleTimeout)
		settleErr := v.settle(settleCtx, d)
		cancel()
		if v.result == resultQuarantined {
			in.unrejected.settled(d, v.err, settleErr == nil)
		}
		errs[i], results[i] = errors.Join(v.err, settleErr), v.result
	}
	in.report(settleBase, results, errs, spans)
	return errs
}

// decide processes batch and returns each delivery's verdict, holding one
// of the ingress's Concurrency connection slots meanwhile.
//
// It first tries the batch whole: one statement records every id, the
// handlers run directly in the transaction. Only if that fails (a handler
// or the database returned an error) is it rolled back and redone with a
// savepoint per message, so that the failure stays with its message. A
// handler may therefore run twice for one message, the first time in a
// transaction that rolled back, as after any rollback and redelivery. If
// that transaction's commit fails for a reason that is not transient (a
// deferred constraint), each message is redone in a transaction of its
// own, so that the commit failure stays with its message too.
func (in *Ingress) decide(ctx context.Context, spans []trace.Span, batch []broker.Delivery) []verdict {
	select {
	case in.conns <- struct{}{}:
		defer func() { <-in.conns }()
	case <-ctx.Done():
		return retryAll(len(batch), ctx.Err())
	}
	problems := make([]error, len(batch))
	for i, d := range batch {
		problems[i] = in.check(d.Message())
		if cause := in.unrejected.cause(d); cause != nil {
			problems[i] = alreadyQuarantinedError{cause}
		}
	}
	if len(batch) > 1 {
		verdicts, err := in.wholeBatch(ctx, spans, batch, problems)
		switch {
		case err == nil:
			return verdicts
		case ctx.Err() != nil:
			return retryAll(len(batch), err)
		}
	}
	verdicts, err := in.inSavepoints(ctx, spans, batch, problems, 0)
	switch {
	case err == nil:
		return verdicts
	case ctx.Err() != nil || transient(err) || errors.Is(err, dbsql.ErrSavepointLeftOpen):
		// Nothing committed: every delivery, quarantined ones included,
		// is redelivered and processed again.
		return retryAll(len(batch), err)
	case len(batch) == 1:
		return []verdict{in.failed(ctx, in.db, batch[0], err)}
	}
	for i := range batch {
		one, err := in.inSavepoints(ctx, spans, batch[i:i+1], problems[i:i+1], i)
		switch {
		case err == nil:
			verdicts[i] = one[0]
		case ctx.Err() != nil || transient(err) || errors.Is(err, dbsql.ErrSavepointLeftOpen):
			verdicts[i] = retryLater(err)
		default:
			verdicts[i] = in.failed(ctx, in.db, batch[i], err)
		}
	}
	return verdicts
}

func retryAll(n int, err error) []verdict {
	verdicts := make([]verdict, n)
	for i := range verdicts {
		verdicts[i] = retryLater(err)
	}
	return verdicts
}

// inSavepoints processes batch in one transaction, each delivery in a
// savepoint of its own; the deliveries are batch[first:] of the spans.
//
// A handler that leaves its savepoint unusable (errHandlerBrokeSavepoint:
// typically it ignored a failed statement, which aborted the whole
// transaction) fails that transaction. It is then redone without running
// that handler again: its delivery fails as a handler error does (counted,
// quarantined at MaxAttempts) and the other deliveries are processed
// anew, so that the handler bug stays with its message.
func (in *Ingress) inSavepoints(ctx context.Context, spans []trace.Span, batch []broker.Delivery, problems []error, first int) ([]verdict, error) {
	// broke[i] is why delivery i's handler broke its savepoint in an
	// earlier pass. Each pass adds one, so there are at most len(batch)+1.
	broke := make([]error, len(batch))
	for {
		verdicts := make([]verdict, len(batch))
		culprit := -1
		err := in.withTx(ctx, func(tx pgx.Tx) error {
			for i, d := range batch {
				if broke[i] != nil {
					verdicts[i] = in.failed(ctx, tx, d, broke[i])
				} else {
					verdicts[i] = in.process(inSpan(ctx, spans, first+i), tx, d, problems[i])
				}
				if !errors.Is(verdicts[i].err, dbsql.ErrSavepointLeftOpen) {
					continue
				}
				if errors.Is(verdicts[i].err, errHandlerBrokeSavepoint) {
					if broke[i] != nil {
						continue // the verdict on the earlier pass's failure: nothing open in tx
					}
					culprit = i
				}
				// Part of a failed delivery's work may still be in tx:
				// committing it would lose the rest for good.
				return verdicts[i].err
			}
			return nil
		})
		if culprit < 0 || ctx.Err() != nil {
			return verdicts, err
		}
		broke[culprit] = verdicts[culprit].err
		d := batch[culprit]
		in.cfg.Logger.Error("llmq: inbox handler bug: it left its savepoint unusable, most likely by ignoring the error of a failed statement; the delivery counts as failed and the rest of its batch is redone without it",
			"consumer", in.cfg.Consumer, "message", d.Message().ID, "source", d.Source(), "err", broke[culprit])
	}
}

// wholeBatch processes batch in one transaction without savepoints, and
// fails (rolling everything back) at the first error.
func (in *Ingress) wholeBatch(ctx context.Context, spans []trace.Span, batch []broker.Delivery, problems []error) ([]verdict, error) {
	verdicts := make([]verdict, len(batch))
	err := in.withTx(ctx, func(tx pgx.Tx) error {
		results, err := in.store.acceptMany(ctx, tx, in.cfg.Consumer, batch, problems)
		if err != nil {
			return err
		}
		for i, d := range batch {
			msg := d.Message()
			switch r := results[i]; {
			case problems[i] != nil:
				verdicts[i], err = in.quarantineInTx(ctx, tx, d, problems[i])
				if err != nil {
					return err
				}
			case r.mismatch != nil:
				verdicts[i] = reject(r.mismatch)
			case r.result == Duplicate:
				verdicts[i] = acceptDuplicate()
			default:
				if err := in.callHandler(inSpan(ctx, spans, i), tx, msg); err != nil {
					return err
				}
				verdicts[i] = acceptNew()
			}
		}
		return nil
	})
	return verdicts, err
}

// quarantineInTx is the whole batch's quarantine of a delivery with a
// problem: a row in tx, or none if it was quarantined before and only its
// Reject failed.
func (in *Ingress) quarantineInTx(ctx context.Context, tx pgx.Tx, d broker.Delivery, problem error) (verdict, error) {
	var again alreadyQuarantinedError
	if errors.As(problem, &again) {
		return reject(again.cause), nil
	}
	if _, err := in.store.Quarantine(ctx, tx, in.cfg.Consumer, d.Message(), d.Source(), problem.Error()); err != nil {
		return verdict{}, err
	}
	return reject(malformed(problem)), nil
}

// withTx runs fn in a transaction of its own and commits it when fn
// returns nil. The commit does not end with ctx: once the work is done, a
// shutdown lets it commit (within settleTimeout) rather than leave its
// outcome unknown, which would nack deliveries that did commit.
func (in *Ingress) withTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := in.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	err = fn(tx)
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err != nil {
		_ = tx.Rollback(endCtx) // fn's error says what happened
		return err
	}
	if err := tx.Commit(endCtx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// callHandler runs the handler, turning a panic into an error.
func (in *Ingress) callHandler(ctx context.Context, tx pgx.Tx, msg broker.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errHandlerPanicked, r)
			in.cfg.Logger.Error("llmq: inbox handler panicked", "consumer", in.cfg.Consumer, "message", msg.ID, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	return in.cfg.Handler(ctx, tx, msg)
}

// settleTimeout bounds a batch's commit once its context ended, and each
// delivery's settle.
const settleTimeout = 10 * time.Second

// accepted is acceptMany's verdict on one message.
type accepted struct {
	result   Result
	mismatch error // ErrDigestMismatch, after a quarantine row was written
}

// acceptMany is Accept for a batch of deliveries in two statements (plus a
// quarantine row per reused id). Deliveries with a problem (checkMessage)
// are left to the caller.
func (s *Store) acceptMany(ctx context.Context, tx pgx.Tx, consumer string, batch []broker.Delivery, problems []error) ([]accepted, error) {
	ids := make([]string, 0, len(batch))
	digests := make([]string, 0, len(batch))
	sources := make([]string, 0, len(batch))
	for i, d := range batch {
		msg := d.Message()
		if problems[i] != nil {
			continue
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
		if problems[i] != nil {
			continue
		}
		existing := recorded[msg.ID]
		switch {
		case isNew[msg.ID]:
			out[i].result = NewMessage
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

// process accepts and handles one delivery in a savepoint of tx; problem
// is checkMessage's verdict on it.
func (in *Ingress) process(ctx context.Context, tx pgx.Tx, d broker.Delivery, problem error) verdict {
	var again alreadyQuarantinedError
	switch {
	case errors.As(problem, &again):
		return reject(again.cause)
	case problem != nil:
		return in.quarantine(ctx, tx, d, malformed(problem))
	}
	msg, source := d.Message(), d.Source()
	var mismatch, handlerErr error
	dup, handled := false, false
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
		handled = true
		handlerErr = in.callHandler(ctx, sp, msg)
		return handlerErr
	})
	switch {
	case errors.Is(err, dbsql.ErrSavepointLeftOpen) && handled && ctx.Err() == nil && !transient(err):
		// The database answered, refusing to end the savepoint, after the
		// handler ran: the handler's doing. The caller fails the whole
		// transaction and redoes it with this delivery failed.
		return retryLater(fmt.Errorf("%w: %w", errHandlerBrokeSavepoint, err))
	case errors.Is(err, dbsql.ErrSavepointLeftOpen):
		return retryLater(err) // and the caller fails the whole transaction
	case mismatch != nil:
		return reject(mismatch)
	case handlerErr != nil:
		return in.failed(ctx, tx, d, handlerErr)
	case err != nil:
		return retryLater(err) // the inbox's own statements: not the message's doing
	case dup:
		return acceptDuplicate()
	}
	return acceptNew()
}

// failed is the verdict on a delivery whose handling failed with err:
// quarantined and rejected if err is permanent or the message reached
// MaxAttempts failures, nacked otherwise. Quarantine rows are written in
// db: a savepoint of the batch's transaction, or a transaction of their
// own.
func (in *Ingress) failed(ctx context.Context, db dbsql.Beginner, d broker.Delivery, err error) verdict {
	switch {
	case permanent(err):
		return in.quarantine(ctx, db, d, malformed(err))
	case ctx.Err() != nil || transient(err):
		return retryLater(err)
	}
	// Counted only when the delivery is settled (handleBatch): this may
	// be a pass whose transaction is rolled back and redone.
	n := in.failures.count(d.Message().ID) + 1
	if n < in.cfg.MaxAttempts {
		v := retryLater(err)
		v.countsAsFailure = true
		return v
	}
	return in.quarantine(ctx, db, d, fmt.Errorf("%w: %d failures, the last: %w", ErrTooManyAttempts, n, err))
}

// malformed wraps err in ErrMalformed unless it is already.
func malformed(err error) error {
	if errors.Is(err, ErrMalformed) {
		return err
	}
	return Malformed(err)
}

// quarantine writes d's quarantine row in db, giving cause as the reason,
// and returns the verdict that rejects it; if the row cannot be written,
// d is nacked instead.
func (in *Ingress) quarantine(ctx context.Context, db dbsql.Beginner, d broker.Delivery, cause error) verdict {
	err := dbsql.WithTx(ctx, db, func(sp pgx.Tx) error {
		_, err := in.store.Quarantine(ctx, sp, in.cfg.Consumer, d.Message(), d.Source(), cause.Error())
		return err
	})
	if err != nil {
		return retryLater(err)
	}
	return reject(cause)
}

// stopped reports whether a Receive ended because Run should end.
func stopped(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, broker.ErrClosed)
}
