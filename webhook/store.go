package webhook

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

//go:embed queries.sql
var queriesSQL string

// DBTX is the caller's transaction or connection: *pgxpool.Pool, *pgx.Conn
// and pgx.Tx all satisfy it. It is llmqtype.DBTX (Begin, Exec, Query and
// QueryRow), the one definition every llmq package shares.
type DBTX = llmqtype.DBTX

// Kind is the job kind of deliveries; register a Dispatcher for it.
const Kind = "webhook.deliver"

// Defaults and limits of a Store.
const (
	DefaultQueue        = "webhooks"
	DefaultAlertTopic   = "llmq.webhooks"
	DefaultMaxBodyBytes = 256 << 10
	DefaultRetention    = 30 * 24 * time.Hour
	DefaultPruneBatch   = 10_000
	MaxEventTypes       = 100
	MaxEventTypeLen     = 200
	MaxEventIDLen       = 255
	MaxDescriptionLen   = 1000
	// AllEvents subscribes an endpoint to every event type.
	AllEvents = "*"
)

// DefaultSchedule is when each attempt of a delivery starts, counted from
// the previous attempt's failure, after Standard Webhooks: at once, then 5s,
// 5m, 30m, 2h, 5h, 10h and 10h again, eight attempts over about a day.
func DefaultSchedule() []time.Duration {
	return []time.Duration{0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}
}

// Backoff is the lease runner's retry policy for Kind: no jitter of its own,
// so that the delay a Dispatcher asks for (the schedule, raised to a
// Retry-After) is the delay. Set lease.Config.RetryByKind[webhook.Kind] to it.
func Backoff() llmqtype.BackoffPolicy {
	return llmqtype.BackoffPolicy{Base: time.Nanosecond, Cap: time.Nanosecond}
}

// Errors callers branch on.
var (
	// ErrInvalidEndpoint is matched by every *llmqtype.ValidationError about
	// endpoint parameters.
	ErrInvalidEndpoint = errors.New("webhook: invalid endpoint")
	// ErrInvalidEvent is matched by every *llmqtype.ValidationError about an event.
	ErrInvalidEvent = errors.New("webhook: invalid event")
	// ErrNotFound is returned for an endpoint or delivery that does not
	// exist for the tenant asking, including another tenant's.
	ErrNotFound = errors.New("webhook: not found")
	// ErrEndpointDisabled is the permanent failure of a delivery whose
	// endpoint was disabled.
	ErrEndpointDisabled = errors.New("webhook: endpoint disabled")
)

// Status says whether an endpoint receives deliveries.
type Status string

// Endpoint statuses.
const (
	StatusEnabled  Status = "enabled"
	StatusDisabled Status = "disabled"
)

// BreakerState is an endpoint's circuit breaker state.
type BreakerState string

// Breaker states.
const (
	BreakerClosed   BreakerState = "closed"    // deliveries go out
	BreakerOpen     BreakerState = "open"      // deliveries are deferred until BreakerUntil
	BreakerHalfOpen BreakerState = "half_open" // one probe is out; the others are deferred
)

// Endpoint is a registered endpoint as stored. Secrets are never read back.
type Endpoint struct {
	ID             uuid.UUID    `json:"id"`
	Tenant         string       `json:"tenant"`
	URL            string       `json:"url"`
	EventTypes     []string     `json:"event_types"`
	Scheme         Scheme       `json:"scheme"`
	SendKeyIDs     bool         `json:"send_key_ids"`
	Description    string       `json:"description,omitempty"`
	Status         Status       `json:"status"`
	DisabledReason string       `json:"disabled_reason,omitempty"`
	Breaker        BreakerState `json:"breaker"`
	BreakerFails   int          `json:"breaker_failures"`
	BreakerUntil   time.Time    `json:"breaker_until,omitzero"`
	AuthFailures   int          `json:"auth_failures"`
	// KeyIDs are the keys signing now, newest first.
	KeyIDs    []string  `json:"key_ids"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// EndpointParams registers an endpoint.
type EndpointParams struct {
	// Tenant owns the endpoint. Required; take it from the caller's
	// credential.
	Tenant string
	// URL receives the deliveries: https (http only when Config.AllowHTTP),
	// no credentials, not a literal internal address.
	URL string
	// EventTypes are the event types delivered; AllEvents for all.
	// At least one.
	EventTypes []string
	// Scheme is the signature layout. Default SchemeStandard.
	Scheme Scheme
	// SendKeyIDs adds KeyIDHeader to every delivery.
	SendKeyIDs bool
	// Secret is the first signing key's raw secret; nil means a fresh
	// random one, returned by RegisterEndpoint.
	Secret      []byte
	Description string
}

// Event is what happened, to deliver to every subscribed endpoint.
type Event struct {
	// ID identifies the event; an endpoint receives an event id once,
	// however often it is enqueued. Default a new UUIDv7.
	ID string
	// Type, such as "invoice.extract.completed". Required.
	Type string
	// Payload is the event's JSON, delivered as "data". Required.
	Payload json.RawMessage
}

// Delivery is one event bound for one endpoint. Its ID is the webhook-id of
// every attempt, retries and replays included.
type Delivery struct {
	ID         uuid.UUID `json:"id"`
	Tenant     string    `json:"tenant"`
	EndpointID uuid.UUID `json:"endpoint_id"`
	EventID    string    `json:"event_id"`
	EventType  string    `json:"event_type"`
	// Body is exactly the bytes every attempt sends.
	Body      []byte    `json:"body"`
	JobID     uuid.UUID `json:"job_id,omitzero"` // set by Enqueue
	CreatedAt time.Time `json:"created_at"`
}

// Attempt is one recorded HTTP attempt of a delivery.
type Attempt struct {
	DeliveryID     uuid.UUID         `json:"delivery_id"`
	JobID          uuid.UUID         `json:"job_id"`
	Attempt        int               `json:"attempt"`
	Worker         string            `json:"worker"`
	URL            string            `json:"url"`
	StartedAt      time.Time         `json:"started_at"`
	Latency        time.Duration     `json:"latency"`
	Status         int               `json:"status,omitempty"` // 0 when no response arrived
	Outcome        string            `json:"outcome"`
	ErrorClass     string            `json:"error_class,omitempty"`
	Error          string            `json:"error,omitempty"`
	KeyIDs         []string          `json:"key_ids"`
	RequestHeaders map[string]string `json:"request_headers"`
	ResponseBody   string            `json:"response_body,omitempty"`
}

// Config configures a Store.
type Config struct {
	// Schema holds the llmq tables. Default "llmq". It must be the job
	// store's (Jobs), or NewStore refuses it.
	Schema string
	// Jobs is the job store deliveries are enqueued in. Required.
	Jobs *jobs.PostgresStore
	// Outbox receives alert events. Required.
	Outbox *outbox.Store
	// Queue is the job queue of deliveries; it must be one of the job
	// store's queues. Default "webhooks".
	Queue string
	// Schedule is the delay before each attempt (the first is usually 0),
	// each at most llmqtype.MaxRetryAfter (24h). Its length is the number
	// of attempts. Default DefaultSchedule().
	Schedule []time.Duration
	// AllowHTTP lets endpoints register plain-http URLs (tests, private
	// networks). Default off.
	AllowHTTP bool
	// Allow exempts address prefixes from the literal-address check at
	// registration; give the Client the same list.
	Allow []netip.Prefix
	// MaxBodyBytes bounds a delivery's body. Default 256 KiB.
	MaxBodyBytes int
	// AlertTopic is the outbox topic of alert events. Default
	// "llmq.webhooks".
	AlertTopic string
	// Sealer, when set, seals every secret stored from now on (see
	// SecretSealer and NewAESGCMSealer), and opens sealed secrets to sign
	// deliveries. Without it secrets are stored raw, and a sealed one
	// cannot be used: the delivery fails with ErrSealed until a sealer is
	// configured. SealSecrets seals the raw ones already stored.
	Sealer SecretSealer
	// Retention is how long Prune keeps deliveries and their attempts,
	// counted from their creation. Default 30 days; it must be at least
	// RetentionFloor(Schedule). A delivery whose job is not finished, or
	// is a dead letter that can be replayed, is kept however old it is.
	Retention time.Duration
}

// Store registers endpoints and enqueues deliveries.
type Store struct {
	cfg    Config
	schema dbsql.Schema
	sql    statements
}

// NewStore validates cfg and prepares the store's SQL for its schema.
func NewStore(cfg Config) (*Store, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	invalid := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: field, Problem: problem}
	}
	switch {
	case cfg.Jobs == nil:
		return nil, invalid("Jobs", "is required")
	case cfg.Outbox == nil:
		return nil, invalid("Outbox", "is required")
	case cfg.Jobs.Config().Schema != schema.Name():
		return nil, invalid("Schema", fmt.Sprintf("is %q but the job store's is %q: give every llmq component the Schema that llmq.Migrate migrated", schema.Name(), cfg.Jobs.Config().Schema))
	case cfg.MaxBodyBytes < 0:
		return nil, invalid("MaxBodyBytes", "must not be negative")
	case len(cfg.Schedule) > jobs.MaxMaxAttempts:
		return nil, invalid("Schedule", fmt.Sprintf("has more than %d steps", jobs.MaxMaxAttempts))
	}
	cfg.Queue = cmp.Or(cfg.Queue, DefaultQueue)
	if !slices.Contains(cfg.Jobs.Config().Queues, cfg.Queue) {
		return nil, invalid("Queue", fmt.Sprintf("%q is not one of the job store's queues %v", cfg.Queue, cfg.Jobs.Config().Queues))
	}
	if len(cfg.Schedule) == 0 {
		cfg.Schedule = DefaultSchedule()
	}
	for i, d := range cfg.Schedule {
		switch {
		case d < 0:
			return nil, invalid(fmt.Sprintf("Schedule[%d]", i), "must not be negative")
		case d > llmqtype.MaxRetryAfter:
			// The runner waits at most that long before a retry: a longer
			// step would be shortened without a word.
			return nil, invalid(fmt.Sprintf("Schedule[%d]", i), fmt.Sprintf("is %s; a retry waits at most %s (llmqtype.MaxRetryAfter)", d, llmqtype.MaxRetryAfter))
		}
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	if floor := RetentionFloor(cfg.Schedule); cfg.Retention < floor {
		return nil, invalid("Retention", fmt.Sprintf("%s does not exceed the schedule's span %s by a day", cfg.Retention, floor-24*time.Hour))
	}
	cfg.AlertTopic = cmp.Or(cfg.AlertTopic, DefaultAlertTopic)
	s := &Store{cfg: cfg, schema: schema}
	if _, err := s.sql.load(schema); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	return s, nil
}

func (s *Store) allowed(a netip.Addr) bool {
	for _, p := range s.cfg.Allow {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

func (s *Store) validateEndpoint(p *EndpointParams) error {
	invalid := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidEndpoint, Field: field, Problem: problem}
	}
	if pr := validate.Text(p.Tenant, true, jobs.MaxTenantLen); pr != "" {
		return invalid("Tenant", pr)
	}
	if _, err := checkURL(p.URL, s.cfg.AllowHTTP, s.allowed); err != nil {
		return &llmqtype.ValidationError{Kind: ErrInvalidEndpoint, Field: "URL", Problem: err.Error(), Cause: err}
	}
	if len(p.EventTypes) == 0 || len(p.EventTypes) > MaxEventTypes {
		return invalid("EventTypes", fmt.Sprintf("has %d types; want 1 to %d", len(p.EventTypes), MaxEventTypes))
	}
	for i, t := range p.EventTypes {
		if pr := validate.Text(t, true, MaxEventTypeLen); pr != "" {
			return invalid(fmt.Sprintf("EventTypes[%d]", i), pr)
		}
	}
	p.Scheme = cmp.Or(p.Scheme, SchemeStandard)
	if !p.Scheme.Valid() {
		return invalid("Scheme", fmt.Sprintf("%q is not a known scheme", p.Scheme))
	}
	if p.Secret == nil {
		p.Secret = NewSecret()
	} else if err := (Key{ID: "k", Secret: p.Secret}).Validate(); err != nil {
		return invalid("Secret", err.Error())
	}
	if pr := validate.Text(p.Description, false, MaxDescriptionLen); pr != "" {
		return invalid("Description", pr)
	}
	return nil
}

// RegisterEndpoint validates p and stores the endpoint with its first key,
// which it returns (with the secret, for the tenant to configure once: it is
// never read back).
func (s *Store) RegisterEndpoint(ctx context.Context, db DBTX, p EndpointParams) (*Endpoint, Key, error) {
	if err := s.validateEndpoint(&p); err != nil {
		return nil, Key{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, Key{}, fmt.Errorf("webhook: endpoint id: %w", err)
	}
	key := Key{ID: newKeyID(), Secret: p.Secret}
	var ep *Endpoint
	err = dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sql.insertEndpoint, id, p.Tenant, p.URL, p.EventTypes, string(p.Scheme), p.SendKeyIDs, p.Description); err != nil {
			return err
		}
		if err := s.insertKey(ctx, tx, id, key); err != nil {
			return err
		}
		ep, err = s.getEndpoint(ctx, tx, p.Tenant, id)
		return err
	})
	if err != nil {
		return nil, Key{}, fmt.Errorf("webhook: registering endpoint: %w", err)
	}
	return ep, key, nil
}

func newKeyID() string { return "key_" + uuid.Must(uuid.NewV7()).String() }

// insertKey stores an endpoint's key, its secret sealed when a Sealer is
// configured.
func (s *Store) insertKey(ctx context.Context, tx pgx.Tx, endpoint uuid.UUID, key Key) error {
	secret, sealed := key.Secret, false
	if s.cfg.Sealer != nil {
		var err error
		if secret, err = s.cfg.Sealer.Seal(key.Secret, keyAssociation(endpoint, key.ID)); err != nil {
			return err
		}
		sealed = true
	}
	_, err := tx.Exec(ctx, s.sql.insertKey, endpoint, key.ID, secret, sealed)
	return err
}

// openKey returns a stored secret as the signer needs it.
func (s *Store) openKey(endpoint uuid.UUID, keyID string, stored []byte, sealed bool) ([]byte, error) {
	if !sealed {
		return stored, nil
	}
	if s.cfg.Sealer == nil {
		return nil, fmt.Errorf("%w: key %s of endpoint %s is sealed and webhook.Config.Sealer is not set", ErrSealed, keyID, endpoint)
	}
	secret, err := s.cfg.Sealer.Open(stored, keyAssociation(endpoint, keyID))
	if err != nil {
		if !errors.Is(err, ErrSealed) { // a sealer of the host's own
			err = fmt.Errorf("%w: %w", ErrSealed, err)
		}
		return nil, fmt.Errorf("key %s of endpoint %s: %w", keyID, endpoint, err)
	}
	return secret, nil
}

// SealSecrets seals, with Config.Sealer, the secrets stored raw (before a
// sealer was configured), and returns how many. Run it once after setting
// a Sealer; it is safe to run again, and alongside dispatchers.
func (s *Store) SealSecrets(ctx context.Context, db DBTX) (int64, error) {
	if s.cfg.Sealer == nil {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "Sealer", Problem: "is required to seal secrets"}
	}
	const batch = 1000
	var total int64
	for {
		var n int64
		err := dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, s.sql.rawKeys, batch)
			if err != nil {
				return err
			}
			type rawKey struct {
				endpoint uuid.UUID
				keyID    string
				secret   []byte
			}
			raw, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (rawKey, error) {
				var k rawKey
				err := row.Scan(&k.endpoint, &k.keyID, &k.secret)
				return k, err
			})
			if err != nil || len(raw) == 0 {
				return err
			}
			endpoints, keyIDs, sealed := make([]uuid.UUID, len(raw)), make([]string, len(raw)), make([][]byte, len(raw))
			for i, k := range raw {
				if sealed[i], err = s.cfg.Sealer.Seal(k.secret, keyAssociation(k.endpoint, k.keyID)); err != nil {
					return err
				}
				endpoints[i], keyIDs[i] = k.endpoint, k.keyID
			}
			tag, err := tx.Exec(ctx, s.sql.sealKeys, dbsql.UUIDs(endpoints), keyIDs, sealed)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return total, fmt.Errorf("webhook: sealing secrets: %w", err)
		}
		total += n
		if n < batch {
			return total, nil
		}
	}
}

// RotateSecret adds a fresh signing key to the endpoint and lets its current
// keys sign for overlap more (zero retires them at once). It returns the new
// key, secret included.
func (s *Store) RotateSecret(ctx context.Context, db DBTX, tenant string, id uuid.UUID, overlap time.Duration) (Key, error) {
	if overlap < 0 {
		return Key{}, &llmqtype.ValidationError{Kind: ErrInvalidEndpoint, Field: "overlap", Problem: "must not be negative"}
	}
	key := Key{ID: newKeyID(), Secret: NewSecret()}
	err := dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		var got uuid.UUID
		if err := tx.QueryRow(ctx, s.sql.lockEndpoint, tenant, id).Scan(&got); err != nil {
			return notFound(err)
		}
		if err := s.insertKey(ctx, tx, id, key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.sql.expireKeys, id, key.ID, overlap.Milliseconds())
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("webhook: rotating the secret of %s: %w", id, err)
	}
	return key, nil
}

// DisableEndpoint stops deliveries to the endpoint: its waiting deliveries
// fail permanently (ErrEndpointDisabled) when they come up.
func (s *Store) DisableEndpoint(ctx context.Context, db DBTX, tenant string, id uuid.UUID, reason string) (*Endpoint, error) {
	return s.setStatus(ctx, db, tenant, id, StatusDisabled, reason)
}

// EnableEndpoint resumes deliveries and closes the endpoint's breaker.
func (s *Store) EnableEndpoint(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Endpoint, error) {
	return s.setStatus(ctx, db, tenant, id, StatusEnabled, "")
}

func (s *Store) setStatus(ctx context.Context, db DBTX, tenant string, id uuid.UUID, st Status, reason string) (*Endpoint, error) {
	tag, err := db.Exec(ctx, s.sql.setStatus, tenant, id, string(st), reason)
	if err != nil {
		return nil, fmt.Errorf("webhook: setting %s %s: %w", id, st, err)
	}
	if tag.RowsAffected() == 0 {
		return nil, ErrNotFound
	}
	return s.getEndpoint(ctx, db, tenant, id)
}

// Endpoint returns the tenant's endpoint, or ErrNotFound.
func (s *Store) Endpoint(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Endpoint, error) {
	return s.getEndpoint(ctx, db, tenant, id)
}

func (s *Store) getEndpoint(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Endpoint, error) {
	ep, err := scanEndpoint(db.QueryRow(ctx, s.sql.getEndpoint, tenant, id))
	if err != nil {
		return nil, notFound(err)
	}
	return ep, nil
}

// ListEndpoints returns the tenant's endpoints.
func (s *Store) ListEndpoints(ctx context.Context, db DBTX, tenant string) ([]*Endpoint, error) {
	rows, err := db.Query(ctx, s.sql.listEndpoints, tenant)
	if err != nil {
		return nil, fmt.Errorf("webhook: listing endpoints: %w", err)
	}
	defer rows.Close()
	var out []*Endpoint
	for rows.Next() {
		ep, err := scanEndpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("webhook: listing endpoints: %w", err)
		}
		out = append(out, ep)
	}
	return out, rows.Err()
}

func scanEndpoint(row pgx.Row) (*Endpoint, error) {
	var r endpointRow
	if err := row.Scan(r.dest()...); err != nil {
		return nil, err
	}
	ep := r.ep
	ep.Scheme, ep.Status, ep.Breaker, ep.BreakerUntil = Scheme(r.scheme), Status(r.status), BreakerState(r.breaker), dbsql.Deref(r.until)
	return &ep, nil
}

func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// deliveryPayload is a delivery job's payload: ids only, the body stays in
// webhook_deliveries.
type deliveryPayload struct {
	DeliveryID uuid.UUID `json:"delivery_id"`
	EndpointID uuid.UUID `json:"endpoint_id"`
}

// Enqueue creates, in the caller's transaction, one delivery of ev for each
// of the tenant's enabled endpoints subscribed to ev.Type, each a job of
// Kind in the store's queue, grouped by endpoint so that one endpoint's
// deliveries go out in order. An endpoint that already has ev.ID gets no
// second delivery. It returns the deliveries created.
func (s *Store) Enqueue(ctx context.Context, tx DBTX, tenant string, ev Event) ([]Delivery, error) {
	body, err := s.validateEvent(tenant, &ev)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, s.sql.subscribed, tenant, ev.Type)
	if err != nil {
		return nil, fmt.Errorf("webhook: enqueue: %w", dbsql.Explain(err, s.schema.Name(), "webhook.Config.Schema"))
	}
	// In pgx's exec and simple-protocol modes the statement's error comes
	// with its rows, not from Query.
	endpoints, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("webhook: enqueue: %w", dbsql.Explain(err, s.schema.Name(), "webhook.Config.Schema"))
	}
	if len(endpoints) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(endpoints))
	for i := range ids {
		if ids[i], err = uuid.NewV7(); err != nil {
			return nil, fmt.Errorf("webhook: delivery id: %w", err)
		}
	}
	var out []Delivery
	err = dbsql.WithTx(ctx, tx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql.insertDeliveries, dbsql.UUIDs(ids), dbsql.UUIDs(endpoints), tenant, ev.ID, ev.Type, body)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
			d := Delivery{Tenant: tenant, EventID: ev.ID, EventType: ev.Type, Body: body}
			return d, r.Scan(&d.ID, &d.EndpointID)
		})
		if err != nil || len(out) == 0 {
			return err
		}
		params := make([]jobs.EnqueueParams, len(out))
		for i, d := range out {
			payload, err := json.Marshal(deliveryPayload{DeliveryID: d.ID, EndpointID: d.EndpointID})
			if err != nil {
				return err
			}
			params[i] = jobs.EnqueueParams{
				Tenant: tenant, Kind: Kind, Queue: s.cfg.Queue, Payload: payload,
				GroupKey: d.EndpointID.String(), MaxAttempts: len(s.cfg.Schedule),
			}
		}
		res, err := s.cfg.Jobs.EnqueueMany(ctx, tx, params)
		if err != nil {
			return err
		}
		for i := range out {
			out[i].JobID = res[i].Job.ID
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: enqueue: %w", dbsql.Explain(err, s.schema.Name(), "webhook.Config.Schema"))
	}
	return out, nil
}

// envelope is the body every delivery sends, in the Standard Webhooks shape.
type envelope struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

func (s *Store) validateEvent(tenant string, ev *Event) ([]byte, error) {
	invalid := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidEvent, Field: field, Problem: problem}
	}
	if pr := validate.Text(tenant, true, jobs.MaxTenantLen); pr != "" {
		return nil, invalid("tenant", pr)
	}
	if pr := validate.Text(ev.Type, true, MaxEventTypeLen); pr != "" {
		return nil, invalid("Type", pr)
	}
	if ev.Type == AllEvents {
		return nil, invalid("Type", "must name a type, not "+AllEvents)
	}
	if ev.ID == "" {
		ev.ID = uuid.Must(uuid.NewV7()).String()
	}
	if pr := validate.Text(ev.ID, true, MaxEventIDLen); pr != "" {
		return nil, invalid("ID", pr)
	}
	if pr, _ := validate.JSON(ev.Payload, s.cfg.MaxBodyBytes); pr != "" {
		return nil, invalid("Payload", pr)
	}
	body, err := json.Marshal(envelope{Type: ev.Type, Timestamp: time.Now().UTC().Truncate(time.Millisecond), Data: ev.Payload})
	if err != nil {
		return nil, invalid("Payload", err.Error())
	}
	if len(body) > s.cfg.MaxBodyBytes {
		return nil, invalid("Payload", fmt.Sprintf("makes a %d-byte body, more than the limit of %d", len(body), s.cfg.MaxBodyBytes))
	}
	return body, nil
}

// Delivery returns the tenant's delivery, or ErrNotFound.
func (s *Store) Delivery(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Delivery, error) {
	var d Delivery
	err := db.QueryRow(ctx, s.sql.getDelivery, tenant, id).Scan(deliveryDest(&d)...)
	if err != nil {
		return nil, notFound(err)
	}
	return &d, nil
}

// Attempts returns the tenant's delivery's attempts, oldest first.
func (s *Store) Attempts(ctx context.Context, db DBTX, tenant string, deliveryID uuid.UUID) ([]Attempt, error) {
	rows, err := db.Query(ctx, s.sql.listAttempts, tenant, deliveryID)
	if err != nil {
		return nil, fmt.Errorf("webhook: attempts: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var row attemptRow
		err := r.Scan(row.dest()...)
		a := row.a
		a.Status = dbsql.Deref(row.status)
		a.Latency = time.Duration(row.ms * float64(time.Millisecond))
		return a, err
	})
}

// Prune deletes deliveries older than Config.Retention with their attempts,
// up to limit of them (0 means DefaultPruneBatch), and returns how many
// deliveries it deleted. Like Pruner.Prune it keeps, whatever their age,
// deliveries whose job is not finished or is a replayable dead letter.
// Several pruners may run at once.
func (s *Store) Prune(ctx context.Context, db DBTX, limit int) (int64, error) {
	if limit < 0 {
		return 0, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "limit", Problem: "must not be negative"}
	}
	tag, err := db.Exec(ctx, s.sql.pruneDeliveries, s.cfg.Retention.Milliseconds(), cmp.Or(limit, DefaultPruneBatch))
	if err != nil {
		return 0, fmt.Errorf("webhook: pruning deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}
