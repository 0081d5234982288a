package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

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

// IngressConfig configures an Ingress.
type IngressConfig struct {
	// Consumer is the inbox consumer name the messages are recorded under.
	// Required.
	Consumer string
	// Handler does each new message's work. Required.
	Handler Handler
	// Logger receives operational messages. Default: discard.
	Logger *slog.Logger
}

// Ingress takes deliveries from a broker.Consumer into the database: each
// message is accepted in the inbox and handled in one transaction, and the
// delivery is acknowledged only after that transaction committed.
//
//   - New message: handled, committed, acknowledged.
//   - Duplicate (a redelivery of a committed message): acknowledged without
//     calling the handler again.
//   - No id, ErrMalformed from the handler, or an id reused with another
//     payload: quarantined and rejected (dead-lettered); the loop goes on.
//   - Any other handler or database error: rolled back and nacked, so the
//     broker redelivers it.
//
// An Ingress handles one delivery at a time, in order; run several, on
// separate consumers, for parallelism.
type Ingress struct {
	store    *Store
	db       dbsql.Beginner
	consumer broker.Consumer
	cfg      IngressConfig
}

// NewIngress validates cfg and returns an ingress reading from consumer
// into db (a pool).
func (s *Store) NewIngress(db dbsql.Beginner, consumer broker.Consumer, cfg IngressConfig) (*Ingress, error) {
	switch {
	case db == nil || consumer == nil:
		return nil, errors.New("inbox: NewIngress needs a database and a consumer")
	case cfg.Handler == nil:
		return nil, errors.New("inbox: IngressConfig.Handler is required")
	}
	if p := validate.Text(cfg.Consumer, true, MaxConsumerLen); p != "" {
		return nil, fmt.Errorf("inbox: IngressConfig.Consumer %s", p)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Ingress{store: s, db: db, consumer: consumer, cfg: cfg}, nil
}

// Run handles deliveries until ctx ends or the consumer is closed.
func (in *Ingress) Run(ctx context.Context) error {
	for {
		d, err := in.consumer.Receive(ctx)
		if stopped(ctx, err) {
			return nil // a shutdown, not a failure
		}
		if err != nil {
			in.cfg.Logger.Warn("llmq: receive failed", "consumer", in.cfg.Consumer, "err", err)
			if !retry.Sleep(ctx, 200*time.Millisecond) {
				return nil
			}
			continue
		}
		err = in.Handle(ctx, d)
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.Is(err, ErrMalformed), errors.Is(err, ErrDigestMismatch):
			in.cfg.Logger.Error("llmq: message quarantined and rejected", "consumer", in.cfg.Consumer, "message", d.Message().ID, "err", err)
		default:
			in.cfg.Logger.Warn("llmq: delivery not accepted; it will be redelivered", "consumer", in.cfg.Consumer, "message", d.Message().ID, "err", err)
		}
	}
}

// Handle processes one delivery as Run does, and returns why it was not
// accepted, if it was not.
func (in *Ingress) Handle(ctx context.Context, d broker.Delivery) error {
	msg, source := d.Message(), d.Source()
	if msg.ID == "" {
		return in.quarantine(ctx, d, "the message has no id")
	}
	var handled error
	err := dbsql.WithTx(ctx, in.db, func(tx pgx.Tx) error {
		res, err := in.store.Accept(ctx, tx, in.cfg.Consumer, msg, source)
		switch {
		case errors.Is(err, ErrDigestMismatch):
			handled = err
			return nil // commit the quarantine row Accept wrote
		case err != nil, res == Duplicate:
			return err
		}
		return in.cfg.Handler(ctx, tx, msg)
	})
	switch {
	case handled != nil:
		return errors.Join(handled, d.Reject(ctx, handled))
	case errors.Is(err, ErrMalformed):
		return in.quarantine(ctx, d, err.Error())
	case err != nil:
		return errors.Join(err, d.Nack(ctx))
	}
	// Committed: only now may the broker forget the message.
	return d.Ack(ctx)
}

func (in *Ingress) quarantine(ctx context.Context, d broker.Delivery, reason string) error {
	err := dbsql.WithTx(ctx, in.db, func(tx pgx.Tx) error {
		_, err := in.store.Quarantine(ctx, tx, in.cfg.Consumer, d.Message(), d.Source(), reason)
		return err
	})
	if err != nil {
		return errors.Join(err, d.Nack(ctx))
	}
	return errors.Join(fmt.Errorf("%w: %s", ErrMalformed, reason), d.Reject(ctx, errors.New(reason)))
}

// stopped reports whether a Receive ended because Run should end.
func stopped(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, broker.ErrClosed)
}
