package outbox

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed queries.sql
var queriesSQL string

// DBTX is the caller's transaction or connection: *pgxpool.Pool, *pgx.Conn
// and pgx.Tx all satisfy it. Pass the transaction that makes the change the
// event describes. It is llmqtype.DBTX (Begin, Exec, Query and QueryRow),
// the one definition every llmq package shares.
type DBTX = llmqtype.DBTX

// ErrInvalidEvent is matched (errors.Is) by every *llmqtype.ValidationError of this
// package.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// Limits on an event's parts. Payloads are signals with ids, not documents.
const (
	DefaultMaxPayloadBytes = 256 << 10
	MaxTopicLen            = 255
	MaxKeyLen              = 255
	MaxTypeLen             = 255
	MaxHeaders             = 64
	MaxHeaderLen           = 8 << 10
)

// Event is one message to publish after the writing transaction commits.
type Event struct {
	// ID identifies the event everywhere downstream (it becomes the broker
	// message ID). Zero means a new UUIDv7.
	ID uuid.UUID `json:"event_id"`
	// AggregateID is the entity the event is about, such as a job's ID.
	// Optional.
	AggregateID uuid.UUID `json:"aggregate_id,omitzero"`
	// Topic routes the event (a Kafka topic, a RabbitMQ routing key).
	// Required.
	Topic string `json:"topic"`
	// Key orders events: those sharing a key are published in write order.
	// Optional.
	Key string `json:"key,omitempty"`
	// Type names what happened, such as "invoice.extract.completed".
	// Required.
	Type string `json:"type"`
	// Payload is the event's JSON body. Required.
	Payload json.RawMessage `json:"payload"`
	// Headers travel with the message (trace context, for example).
	Headers map[string]string `json:"headers,omitempty"`
}

// Record is an event as stored, with its publication status.
type Record struct {
	Event
	Seq         int64     `json:"seq"`
	CreatedAt   time.Time `json:"created_at"`
	Attempts    int       `json:"attempts"`
	PublishedAt time.Time `json:"published_at,omitzero"` // zero until a broker confirmed it
	LastError   string    `json:"last_error,omitempty"`
}

// Config configures a Store. The zero value uses the "llmq" schema and the
// default limits.
type Config struct {
	// Schema holds the llmq tables. Default "llmq".
	Schema string
	// MaxPayloadBytes bounds Event.Payload. Default 256 KiB.
	MaxPayloadBytes int
	// Propagator writes the trace context of Write's context into an
	// event's headers when they carry none. Default: W3C TraceContext
	// (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
}

// Store writes and reads the outbox table.
type Store struct {
	schema          dbsql.Schema
	maxPayloadBytes int
	propagator      propagation.TextMapPropagator
	channel         string
	sql             statements
}

// NewStore validates cfg and prepares the store's SQL for its schema.
func NewStore(cfg Config) (*Store, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	if cfg.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("outbox: MaxPayloadBytes is %d; use 0 for the default or a positive limit", cfg.MaxPayloadBytes)
	}
	s := &Store{
		schema:          schema,
		maxPayloadBytes: cmp.Or(cfg.MaxPayloadBytes, DefaultMaxPayloadBytes),
		propagator:      telemetry.Propagator(cfg.Propagator),
		channel:         schema.Channel("outbox"),
	}
	if _, err := s.sql.load(schema); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return s, nil
}

// Channel is the NOTIFY channel Write signals on.
func (s *Store) Channel() string { return s.channel }

// Write validates ev and inserts it on db, normally the transaction that
// makes the change ev describes. It returns the event as stored, with its ID
// filled in. Invalid events return a *llmqtype.ValidationError and write nothing.
// When ctx holds a span and ev's headers carry no trace context, the span's
// is added to them (Config.Propagator), so the event's consumers continue
// the writer's trace.
func (s *Store) Write(ctx context.Context, db DBTX, ev Event) (Record, error) {
	if err := s.validate(&ev); err != nil {
		return Record{}, err
	}
	ev.Headers = s.withTraceContext(ctx, ev.Headers)
	headers, err := headersJSON(ev)
	if err != nil {
		return Record{}, err
	}
	rec := Record{Event: ev}
	err = db.QueryRow(ctx, s.sql.insertEvent,
		ev.ID, dbsql.NullIfZero(ev.AggregateID), ev.Topic, dbsql.NullIfZero(ev.Key), ev.Type, string(ev.Payload), headers, s.channel,
	).Scan(&rec.Seq, &rec.CreatedAt)
	if err != nil {
		err = dbsql.Explain(err, s.schema.Name(), "outbox.Config.Schema")
		return Record{}, fmt.Errorf("outbox: writing event %s (%s): %w", ev.ID, ev.Type, err)
	}
	return rec, nil
}

// headersJSON is ev's headers as the JSON text the headers column is
// bound from: text, which pgx sends alike whether or not it knows the
// parameter's type (a map has no encoding without it; see dbsql.UUID).
func headersJSON(ev Event) (string, error) {
	if len(ev.Headers) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(ev.Headers)
	if err != nil {
		return "", fmt.Errorf("outbox: headers of event %s: %w", ev.ID, err)
	}
	return string(b), nil
}

// withTraceContext returns headers with ctx's trace context added, when ctx
// has a span and headers no trace context of their own; headers unchanged
// otherwise. The caller's map is never written to.
func (s *Store) withTraceContext(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	for _, f := range s.propagator.Fields() {
		if _, ok := headers[f]; ok {
			return headers
		}
	}
	out := make(map[string]string, len(headers)+2)
	maps.Copy(out, headers)
	s.propagator.Inject(ctx, propagation.MapCarrier(out))
	return out
}

// ListByAggregate returns the stored events about aggregateID in write
// order. Events are pruned some time after publication, so this is a recent
// history, not an archive; it scans the outbox (no index serves it, to keep
// writes cheap), so it is for inspection, not for hot paths.
func (s *Store) ListByAggregate(ctx context.Context, db DBTX, aggregateID uuid.UUID) ([]Record, error) {
	rows, err := db.Query(ctx, s.sql.listByAggregate, aggregateID)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing events of %s: %w", aggregateID, s.explain(err))
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var l listedRow
		if err := row.Scan(l.dest()...); err != nil {
			return l.r, err
		}
		r := l.r
		r.AggregateID = dbsql.Deref(l.aggregate)
		r.Key = dbsql.Deref(l.key)
		r.LastError = dbsql.Deref(l.lastError)
		r.PublishedAt = dbsql.Deref(l.publishedAt)
		r.Payload = l.payload
		headers := l.headers
		if err := json.Unmarshal(headers, &r.Headers); err != nil {
			return r, fmt.Errorf("headers of event %s: %w", r.ID, err)
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: listing events of %s: %w", aggregateID, s.explain(err))
	}
	return recs, nil
}

// explain turns an undefined-table error into a
// *llmqtype.NotMigratedError naming the store's schema (see
// dbsql.Explain).
func (s *Store) explain(err error) error {
	return dbsql.Explain(err, s.schema.Name(), "outbox.Config.Schema")
}

func (s *Store) validate(ev *Event) error {
	fail := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidEvent, Field: field, Problem: problem}
	}
	if p := validate.Text(ev.Topic, true, MaxTopicLen); p != "" {
		return fail("Topic", p)
	}
	if p := validate.Text(ev.Key, false, MaxKeyLen); p != "" {
		return fail("Key", p)
	}
	if p := validate.Text(ev.Type, true, MaxTypeLen); p != "" {
		return fail("Type", p)
	}
	if len(ev.Payload) == 0 {
		return fail("Payload", "must not be empty")
	}
	if p, _ := validate.JSON(ev.Payload, s.maxPayloadBytes); p != "" {
		return fail("Payload", p)
	}
	if len(ev.Headers) > MaxHeaders {
		return fail("Headers", fmt.Sprintf("has %d entries, more than the limit of %d", len(ev.Headers), MaxHeaders))
	}
	for k, v := range ev.Headers {
		if p := validate.Text(k, true, MaxHeaderLen); p != "" {
			return fail("Headers", fmt.Sprintf("name %q %s", k, p))
		}
		if p := validate.Text(v, false, MaxHeaderLen); p != "" {
			return fail("Headers", fmt.Sprintf("value of %q %s", k, p))
		}
	}
	if ev.ID == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return fmt.Errorf("outbox: new event id: %w", err)
		}
		ev.ID = id
	}
	return nil
}
