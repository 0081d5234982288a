package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

// DefaultMaxReceiveBytes bounds a received body when ReceiverConfig says
// nothing.
const DefaultMaxReceiveBytes = 1 << 20

// Received is a verified delivery, handed to the receiver's work.
type Received struct {
	Verified
	// Body is exactly the bytes that were signed.
	Body   []byte
	Header http.Header
}

// ReceiveFunc does a delivery's work in tx, the transaction that records its
// id in the inbox. An error rolls both back and the sender is told to retry
// (503).
type ReceiveFunc func(ctx context.Context, tx pgx.Tx, d Received) error

// ReceiverConfig configures a Receiver.
type ReceiverConfig struct {
	// Verifier checks signatures. Required.
	Verifier *Verifier
	// Inbox deduplicates delivery ids. Required.
	Inbox *inbox.Store
	// DB begins the transaction of each delivery (a *pgxpool.Pool).
	// Required.
	DB DBTX
	// Consumer names this receiver in the inbox. Required.
	Consumer string
	// Handle does the work. Required.
	Handle ReceiveFunc
	// MaxBodyBytes bounds a delivery's body; a larger one is refused with
	// 413 before it is verified. Default 1 MiB.
	MaxBodyBytes int64
	// OnDigestMismatch, when set, is called (outside any transaction) when
	// a delivery id arrives again with another body: it was quarantined,
	// not processed, and someone should look.
	OnDigestMismatch func(ctx context.Context, d Received)
	// Logger receives warnings and errors (a delivery not accepted, a
	// delivery id reused with another body). Default: slog.Default(), as it
	// is when NewReceiver runs.
	Logger *slog.Logger
	// MeterProvider receives llmq.webhook.received ({delivery}; status):
	// every delivery by the status it was answered with. Nil means none.
	MeterProvider metric.MeterProvider
}

// Receiver is the http.Handler a consuming service mounts to accept signed
// deliveries:
//
//   - 413 for a body over the limit, 405 for anything but POST;
//   - 400 for missing or malformed signature headers (or an id the inbox
//     cannot record), 401 for a signature
//     that does not match or a timestamp outside the window;
//   - then, in one transaction, the delivery id is accepted in the inbox and
//     the work runs: 204 only after the commit; 200 for a duplicate, without
//     running the work again; 409 for a reused id with another body
//     (quarantined); 503 when the work or the transaction failed, so the
//     sender retries.
type Receiver struct {
	cfg      ReceiverConfig
	received metric.Int64Counter
}

// NewReceiver validates cfg once.
func NewReceiver(cfg ReceiverConfig) (*Receiver, error) {
	invalid := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: field, Problem: problem}
	}
	switch {
	case cfg.Verifier == nil:
		return nil, invalid("Verifier", "is required")
	case cfg.Inbox == nil:
		return nil, invalid("Inbox", "is required")
	case cfg.DB == nil:
		return nil, invalid("DB", "is required")
	case cfg.Handle == nil:
		return nil, invalid("Handle", "is required")
	case cfg.MaxBodyBytes < 0:
		return nil, invalid("MaxBodyBytes", "must not be negative")
	}
	if p := validate.Text(cfg.Consumer, true, inbox.MaxConsumerLen); p != "" {
		return nil, invalid("Consumer", p)
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxReceiveBytes)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	received, err := telemetry.Meter(cfg.MeterProvider, "webhook").Int64Counter("llmq.webhook.received",
		metric.WithUnit("{delivery}"), metric.WithDescription("Deliveries the receiver answered, by HTTP status."))
	if err != nil {
		return nil, fmt.Errorf("webhook: receiver instruments: %w", err)
	}
	return &Receiver{cfg: cfg, received: received}, nil
}

// statusRecorder remembers the status a handler answered with.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// ServeHTTP implements http.Handler.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !rc.received.Enabled(r.Context()) {
		rc.serve(w, r)
		return
	}
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	rc.serve(rec, r)
	rc.received.Add(r.Context(), 1, metric.WithAttributes(attribute.Int("status", rec.status)))
}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rc.cfg.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, fmt.Sprintf("body over %d bytes", rc.cfg.MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading the body failed", http.StatusBadRequest)
		return
	}
	v, err := rc.cfg.Verifier.Verify(r.Header, body)
	switch {
	case errors.Is(err, ErrMissingHeader), errors.Is(err, ErrMalformedHeader):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	d := Received{Verified: v, Body: body, Header: r.Header}
	status, err := rc.accept(r.Context(), d)
	if errors.Is(err, inbox.ErrDigestMismatch) {
		rc.cfg.Logger.Error("webhook: delivery id reused with another body; quarantined", "delivery", d.ID)
		if rc.cfg.OnDigestMismatch != nil {
			rc.cfg.OnDigestMismatch(r.Context(), d)
		}
	} else if err != nil {
		rc.cfg.Logger.Warn("webhook: delivery not accepted", "delivery", d.ID, "err", err)
	}
	w.WriteHeader(status)
}

// accept runs the inbox dedup and the work in one transaction, and says
// which status to answer.
func (rc *Receiver) accept(ctx context.Context, d Received) (int, error) {
	msg := broker.Message{ID: d.ID, Body: d.Body}
	src := broker.Source{Queue: "webhook"}
	var res inbox.Result
	err := dbsql.WithTx(ctx, rc.cfg.DB, func(tx pgx.Tx) error {
		var err error
		res, err = rc.cfg.Inbox.Accept(ctx, tx, rc.cfg.Consumer, msg, src)
		if err != nil || res == inbox.Duplicate {
			return err
		}
		return rc.cfg.Handle(ctx, tx, d)
	})
	switch {
	case errors.Is(err, inbox.ErrDigestMismatch):
		// Keep the quarantine row Accept wrote: commit it without the work.
		qerr := dbsql.WithTx(ctx, rc.cfg.DB, func(tx pgx.Tx) error {
			_, qerr := rc.cfg.Inbox.Accept(ctx, tx, rc.cfg.Consumer, msg, src)
			if errors.Is(qerr, inbox.ErrDigestMismatch) {
				return nil
			}
			return qerr
		})
		if qerr != nil {
			return http.StatusServiceUnavailable, errors.Join(err, qerr)
		}
		return http.StatusConflict, err
	case errors.Is(err, inbox.ErrInvalidMessage):
		return http.StatusBadRequest, err // an id the inbox cannot hold: no retry will fix it
	case err != nil:
		return http.StatusServiceUnavailable, err
	case res == inbox.Duplicate:
		return http.StatusOK, nil
	}
	return http.StatusNoContent, nil
}
