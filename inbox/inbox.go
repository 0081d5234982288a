package inbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed queries.sql
var queriesSQL string

// DBTX is the caller's transaction or connection: *pgxpool.Pool, *pgx.Conn
// and pgx.Tx all satisfy it. Accept belongs in the transaction that does the
// message's work. It is llmqtype.DBTX (Begin, Exec, Query and QueryRow), the
// one definition every llmq package shares.
type DBTX = llmqtype.DBTX

// Result says whether a message is new.
type Result int

const (
	// NewMessage means the message is recorded: do its work in the same
	// transaction.
	NewMessage Result = iota + 1
	// Duplicate means the message was accepted before with the same
	// payload: do nothing (and acknowledge the delivery).
	Duplicate
)

func (r Result) String() string {
	switch r {
	case NewMessage:
		return "new"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

var (
	// ErrDigestMismatch reports a message that reused an accepted id with
	// another payload. It was quarantined, not processed; alert on it.
	ErrDigestMismatch = errors.New("inbox: message id reused with a different payload")
	// ErrInvalidMessage is matched by every *llmqtype.ValidationError of this package.
	ErrInvalidMessage = errors.New("inbox: invalid message")
)

// Limits and defaults.
const (
	MaxConsumerLen       = 200
	MaxMessageIDLen      = 255
	MaxQuarantinePayload = 64 << 10
	DefaultRetention     = 7 * 24 * time.Hour
	MinRetention         = time.Hour
)

// Config configures a Store. The zero value uses the "llmq" schema and a
// retention of 7 days.
type Config struct {
	// Schema holds the llmq tables. Default "llmq".
	Schema string
	// Retention is how long accepted ids are remembered. It must exceed the
	// sender's whole retry window (days, not minutes). Default 7 days;
	// at least 1 hour.
	Retention time.Duration
}

// Store is the inbox.
type Store struct {
	retention time.Duration
	schema    string
	sql       statements
}

// NewStore validates cfg and prepares the inbox's SQL for its schema.
func NewStore(cfg Config) (*Store, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	if cfg.Retention != 0 && cfg.Retention < MinRetention {
		return nil, fmt.Errorf("inbox: Retention is %s; use 0 for the default of %s, or at least %s: it must outlast the sender's retries", cfg.Retention, DefaultRetention, MinRetention)
	}
	s := &Store{retention: cmp.Or(cfg.Retention, DefaultRetention), schema: schema.Name()}
	if _, err := s.sql.load(schema); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	return s, nil
}

// Digest is the payload digest Accept compares: the hex SHA-256 of body.
func Digest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// Accept records msg for consumer in tx, unless it was accepted before. It
// returns NewMessage (do the work in tx), Duplicate (do nothing), or
// ErrDigestMismatch after writing a quarantine row in tx. A message without
// an id is a *llmqtype.ValidationError; quarantine it with Quarantine instead.
func (s *Store) Accept(ctx context.Context, tx DBTX, consumer string, msg broker.Message, source broker.Source) (Result, error) {
	if p := validate.Text(consumer, true, MaxConsumerLen); p != "" {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidMessage, Field: "consumer", Problem: p}
	}
	if p := validate.Text(msg.ID, true, MaxMessageIDLen); p != "" {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidMessage, Field: "Message.ID", Problem: p}
	}
	digest := Digest(msg.Body)
	src, err := jsonText(source)
	if err != nil {
		return 0, fmt.Errorf("inbox: accepting %s for %s: source: %w", msg.ID, consumer, err)
	}
	var inserted bool
	err = tx.QueryRow(ctx, s.sql.insert, consumer, msg.ID, digest, src).Scan(&inserted)
	switch {
	case err == nil:
		return NewMessage, nil
	case !errors.Is(err, pgx.ErrNoRows):
		err = dbsql.Explain(err, s.schema, "inbox.Config.Schema")
		return 0, fmt.Errorf("inbox: accepting %s for %s: %w", msg.ID, consumer, err)
	}
	// The id was taken: by a committed transaction, which this second
	// statement sees under READ COMMITTED.
	var existing, status string
	if err := tx.QueryRow(ctx, s.sql.selectOne, consumer, msg.ID).Scan(&existing, &status); err != nil {
		return 0, fmt.Errorf("inbox: reading %s for %s: %w", msg.ID, consumer, err)
	}
	if existing == digest {
		return Duplicate, nil
	}
	return 0, s.quarantineMismatch(ctx, tx, consumer, msg, source, existing)
}

// checkMessage returns why the ingress can never accept msg, whatever it
// retries: no id or one Accept refuses, a null body, or a header that is
// not valid UTF-8 or contains NUL (handlers pass headers on to text
// columns and to trace propagation). It is a *llmqtype.ValidationError, or nil.
func checkMessage(msg broker.Message) error {
	invalid := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidMessage, Field: field, Problem: problem}
	}
	if msg.ID == "" {
		return invalid("Message.ID", "is missing: the message has no id")
	}
	if p := validate.Text(msg.ID, true, MaxMessageIDLen); p != "" {
		return invalid("Message.ID", p)
	}
	if msg.Body == nil {
		return invalid("Message.Body", "is null (a Kafka tombstone); an event needs a payload, if only an empty one")
	}
	for k, v := range msg.Headers {
		if !validate.Storable(k) || !validate.Storable(v) {
			return invalid("Message.Headers", headerProblem(msg.Headers))
		}
	}
	return nil
}

// headerProblem names the first header, in key order, that text cannot
// hold. Sorting only here keeps the common path free of allocations.
func headerProblem(headers map[string]string) string {
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		switch v := headers[k]; {
		case !validate.Storable(k):
			return fmt.Sprintf("key %s is not valid UTF-8 or contains NUL", quoteShort(k))
		case !validate.Storable(v):
			return fmt.Sprintf("value of %s is not valid UTF-8 or contains NUL", quoteShort(k))
		}
	}
	return ""
}

// quoteShort quotes at most the first 64 bytes of s, for an error message.
func quoteShort(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}

// quarantineMismatch quarantines msg, whose id was accepted before with the
// payload digest existing, and returns the ErrDigestMismatch to report.
func (s *Store) quarantineMismatch(ctx context.Context, tx DBTX, consumer string, msg broker.Message, source broker.Source, existing string) error {
	reason := fmt.Sprintf("message id %s was accepted before with payload digest %s; this delivery's digest is %s", msg.ID, existing, Digest(msg.Body))
	if _, err := s.Quarantine(ctx, tx, consumer, msg, source, reason); err != nil {
		return err
	}
	return fmt.Errorf("%w: consumer %s, %s", ErrDigestMismatch, consumer, reason)
}

// Quarantine keeps a message that must not be processed (undecodable,
// without an id, or a reused id) for people to inspect, and returns its
// quarantine id. It stores anything a broker can deliver, as received: an
// id or headers that are not valid UTF-8 or contain NUL are kept as bytes
// (the readable message_id and headers columns then show what text can),
// and a nil Body (a null payload, such as a Kafka tombstone) stays distinct
// from an empty one.
func (s *Store) Quarantine(ctx context.Context, db DBTX, consumer string, msg broker.Message, source broker.Source, reason string) (int64, error) {
	payload := msg.Body
	if len(payload) > MaxQuarantinePayload {
		payload = payload[:MaxQuarantinePayload]
	}
	var rawID []byte
	if msg.ID != "" {
		rawID = []byte(msg.ID)
	}
	keys := slices.Sorted(maps.Keys(msg.Headers))
	rawKeys, rawValues := make([][]byte, len(keys)), make([][]byte, len(keys))
	readable := make(map[string]string, len(keys))
	for i, k := range keys {
		v := msg.Headers[k]
		rawKeys[i], rawValues[i] = []byte(k), []byte(v)
		if validate.Storable(k) && validate.Storable(v) {
			readable[k] = v
		}
	}
	var textID *string
	if msg.ID != "" && validate.Storable(msg.ID) {
		textID = &msg.ID
	}
	// A reason may quote what the message carried, which may not be text.
	reason = validate.MakeStorable(reason)
	src, err := jsonText(source)
	if err != nil {
		return 0, fmt.Errorf("inbox: quarantining a message for %s: source: %w", consumer, err)
	}
	headers, err := jsonText(readable)
	if err != nil {
		return 0, fmt.Errorf("inbox: quarantining a message for %s: headers: %w", consumer, err)
	}
	var id int64
	err = db.QueryRow(ctx, s.sql.quarantine, consumer, textID, Digest(msg.Body), src, headers, payload,
		reason, rawID, rawKeys, rawValues).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("inbox: quarantining a message for %s: %w", consumer, err)
	}
	return id, nil
}

// jsonText is v, a broker.Source or a map of strings, as the JSON text a
// jsonb column is bound from: text, which pgx sends alike whether or not it
// knows the parameter's type (its exec and simple-protocol modes have no
// encoding for a struct or a map).
func jsonText[T broker.Source | map[string]string](v T) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// Quarantined is a message kept out of processing, as it was received.
type Quarantined struct {
	ID       int64  `json:"id"`
	Consumer string `json:"consumer"`
	// MessageID is the id's bytes as received ("" when it had none), even
	// when they are not valid UTF-8 (encoding/json then shows U+FFFD).
	MessageID     string        `json:"message_id,omitempty"`
	PayloadDigest string        `json:"payload_digest"`
	Source        broker.Source `json:"source"`
	// Headers are the message's headers as received, byte for byte.
	Headers map[string]string `json:"headers,omitempty"`
	// Payload is the body, truncated to MaxQuarantinePayload bytes; nil
	// for a null body (a Kafka tombstone), non-nil and empty for an empty
	// one.
	Payload    []byte    `json:"payload"`
	Reason     string    `json:"reason"`
	ReceivedAt time.Time `json:"received_at"`
}

// ListQuarantined returns up to limit of consumer's quarantined messages,
// oldest first.
func (s *Store) ListQuarantined(ctx context.Context, db DBTX, consumer string, limit int) ([]Quarantined, error) {
	rows, err := db.Query(ctx, s.sql.listQuarantine, consumer, max(limit, 1))
	if err != nil {
		return nil, fmt.Errorf("inbox: listing quarantine of %s: %w", consumer, err)
	}
	out, err := pgx.CollectRows(rows, scanQuarantined)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing quarantine of %s: %w", consumer, err)
	}
	return out, nil
}

func scanQuarantined(row pgx.CollectableRow) (Quarantined, error) {
	var r quarantinedRow
	if err := row.Scan(r.dest()...); err != nil {
		return r.q, err
	}
	q, messageID, source, rawID, rawKeys, rawValues := r.q, r.messageID, r.source, r.rawID, r.rawKeys, r.rawValues
	q.MessageID = dbsql.Deref(messageID)
	if rawID != nil {
		q.MessageID = string(rawID)
	}
	if rawKeys != nil && len(rawKeys) == len(rawValues) {
		// Written since the raw columns exist: they are exact.
		q.Headers = make(map[string]string, len(rawKeys))
		for i, k := range rawKeys {
			q.Headers[string(k)] = string(rawValues[i])
		}
	}
	if len(q.Headers) == 0 {
		q.Headers = nil
	}
	return q, json.Unmarshal(source, &q.Source)
}

// Prune deletes accepted ids older than the retention, in batches of up to
// limit (0 means 10,000), and returns how many it deleted. Several pruners
// may run at once.
func (s *Store) Prune(ctx context.Context, db DBTX, limit int) (int64, error) {
	if limit <= 0 {
		limit = 10_000
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, s.sql.prune, s.retention.Milliseconds(), limit)
		if err != nil {
			return total, fmt.Errorf("inbox: pruning: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(limit) {
			return total, nil
		}
	}
}
