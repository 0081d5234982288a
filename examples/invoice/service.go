package invoice

import (
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/internal/sqlfile"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

//go:embed queries.sql
var queriesSQL string

// The job kind, queues and event type of the service.
const (
	Kind  = "invoice.extract"
	Queue = "extraction"
	// BatchQueue is the queue of the documents that can wait: a provider
	// batch submitter (NewBatchSubmitter) serves it at the batch price.
	BatchQueue      = "extraction-batch"
	CompletedEvent  = Kind + ".completed"
	DefaultSchema   = "invoice"
	maxDocumentText = 256 << 10
)

// Credential is what a bearer token stands for: a tenant, and whether its
// holder is an operator (who may read retry details).
type Credential struct {
	Tenant   string
	Operator bool
}

// Auth is the bearer-token table. Tokens can be revoked while the service
// runs; a revoked token's event stream ends.
type Auth struct {
	mu sync.RWMutex
	// tokens is keyed by each token's SHA-256, never by the token: a map
	// lookup compares keys byte by byte and stops at the first difference,
	// so keyed by the token its timing would tell an attacker how much of a
	// guess was right. Timing can at most reveal a prefix of a digest,
	// which says nothing about the token. (The table also holds no token
	// in the clear.)
	tokens map[[sha256.Size]byte]Credential
}

// NewAuth returns a table holding tokens.
func NewAuth(tokens map[string]Credential) *Auth {
	a := &Auth{tokens: make(map[[sha256.Size]byte]Credential, len(tokens))}
	for k, v := range tokens {
		a.tokens[sha256.Sum256([]byte(k))] = v
	}
	return a
}

// Lookup returns token's credential.
func (a *Auth) Lookup(token string) (Credential, bool) {
	digest := sha256.Sum256([]byte(token))
	a.mu.RLock()
	defer a.mu.RUnlock()
	c, ok := a.tokens[digest]
	return c, ok
}

// Revoke removes token.
func (a *Auth) Revoke(token string) {
	digest := sha256.Sum256([]byte(token))
	a.mu.Lock()
	delete(a.tokens, digest)
	a.mu.Unlock()
}

// Config configures a Service.
type Config struct {
	// Schema holds llmq's tables and the service's own. Default "invoice".
	Schema string
	// Auth is the token table. Required.
	Auth *Auth
	// Quota is the default tenant quota; SetTenantQuota sets others.
	Quota admission.TenantQuota
	// SystemMaxPendingJobs bounds all tenants' pending jobs (503 beyond).
	SystemMaxPendingJobs int64
	// QuotaRetry is the Retry-After of a quota refusal. Default 30s.
	QuotaRetry time.Duration
	// WebhookSchedule is the delay before each delivery attempt. Default
	// webhook.DefaultSchedule().
	WebhookSchedule []time.Duration
	// AllowLoopback lets tenants register plain-http loopback endpoints
	// (tests and the demo); off in production.
	AllowLoopback bool
	// MaxTokens is the model's output budget per call. Default 800.
	MaxTokens int
	// BatchLane sends a document whose needed_by is at least BatchLead
	// ahead to BatchQueue, served through the provider's batch API at half
	// price by the submitter NewBatchSubmitter returns (run it, or those
	// documents wait). Off, every document is extracted synchronously and
	// needed_by only sets its deadline.
	BatchLane bool
	// ReplayWindow is the most events a reconnecting stream replays.
	// Default DefaultReplayWindow.
	ReplayWindow int
	// TracerProvider records an acceptance span for each POST
	// /extraction-jobs, continuing the caller's W3C trace context (the
	// traceparent header) when it sends one; the job store stores it, so
	// the job's attempts and events join that trace. Default: no tracing.
	TracerProvider trace.TracerProvider
	// StreamGapWait is the longest the event stream holds back at a gap in
	// the outbox sequence whose transactions it cannot see end (see
	// Service.events). Default 2s.
	StreamGapWait time.Duration
	// Logger receives the cause of every 5xx the API answers, and why an
	// event stream ended early. Default: slog.Default().
	Logger *slog.Logger
}

// Service holds the stores the API and the worker share.
type Service struct {
	cfg  Config
	pool *pgxpool.Pool
	q    sqlfile.Queries

	// accept is the job store the API enqueues through: its OnAccept hook
	// enforces tenant quotas. Work is the store everything else uses
	// (the runner, webhook deliveries), without the hook: a delivery of a
	// finished extraction must never be refused by a quota, or the
	// extraction's success could not be recorded.
	accept   *jobs.PostgresStore
	Jobs     *jobs.PostgresStore
	Outbox   *outbox.Store
	Webhooks *webhook.Store
	Quotas   *admission.Quotas
}

// New validates cfg and builds the service's stores on pool. Call Migrate
// before serving.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if cfg.Auth == nil {
		return nil, errors.New("invoice: Config.Auth is required")
	}
	cfg.Schema = cmp.Or(cfg.Schema, DefaultSchema)
	cfg.MaxTokens = cmp.Or(cfg.MaxTokens, 800)
	cfg.ReplayWindow = cmp.Or(cfg.ReplayWindow, DefaultReplayWindow)
	cfg.StreamGapWait = cmp.Or(cfg.StreamGapWait, defaultStreamGapWait)
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = noop.NewTracerProvider()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	q, err := sqlfile.Load(cfg.Schema, queriesSQL)
	if err != nil {
		return nil, err
	}
	quotas, err := admission.NewQuotas(admission.QuotaConfig{
		Schema: cfg.Schema, Default: cfg.Quota, SystemMaxPendingJobs: cfg.SystemMaxPendingJobs, RetryHint: cfg.QuotaRetry,
	})
	if err != nil {
		return nil, err
	}
	queues := []string{Queue, BatchQueue, webhook.DefaultQueue}
	accept, err := jobs.NewStore(jobs.Config{Schema: cfg.Schema, Queues: queues, OnAccept: quotas.Hook()})
	if err != nil {
		return nil, err
	}
	work, err := jobs.NewStore(jobs.Config{Schema: cfg.Schema, Queues: queues})
	if err != nil {
		return nil, err
	}
	ob, err := outbox.NewStore(outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	wcfg := webhook.Config{Schema: cfg.Schema, Jobs: work, Outbox: ob, Schedule: cfg.WebhookSchedule}
	if cfg.AllowLoopback {
		wcfg.AllowHTTP, wcfg.Allow = true, loopback()
	}
	wh, err := webhook.NewStore(wcfg)
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, pool: pool, q: q, accept: accept, Jobs: work, Outbox: ob, Webhooks: wh, Quotas: quotas}, nil
}

// Migrate creates the service's own tables (llmq's come from llmq.Migrate).
func (s *Service) Migrate(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, s.q["CreateTables"])
	return err
}

// Document is an immutable version of a stored document.
type Document struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	SHA256  string `json:"sha256"`
}

// PutDocument stores text as the next version of the tenant's named document
// (or returns the latest version if it holds the same text).
func (s *Service) PutDocument(ctx context.Context, tenant, name, text string) (Document, error) {
	sum := sha256.Sum256([]byte(text))
	digest := hex.EncodeToString(sum[:])
	var v int
	if err := s.pool.QueryRow(ctx, s.q["PutDocument"], tenant, name, digest, text).Scan(&v); err != nil {
		return Document{}, fmt.Errorf("invoice: store document: %w", err)
	}
	return Document{Name: name, Version: v, SHA256: digest}, nil
}

// errNoDocument is a document version the tenant does not have.
var errNoDocument = errors.New("invoice: no such document version")

func (s *Service) document(ctx context.Context, tenant string, d Document) (string, error) {
	var digest, text string
	err := s.pool.QueryRow(ctx, s.q["GetDocument"], tenant, d.Name, d.Version).Scan(&digest, &text)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", errNoDocument
	}
	if err != nil {
		return "", err
	}
	if digest != d.SHA256 {
		return "", errDigestMismatch
	}
	return text, nil
}

var errDigestMismatch = errors.New("invoice: document digest does not match the version")

// PutSupplier records a supplier's master data for tenant. An IBAN that
// replaces another invalidates the tenant's reusable extractions
// (jobs.InvalidateReuse), in the same transaction: each passed the policy
// against the IBAN on file when it was computed, so a document that passed
// against the old one must be checked, and so extracted, again.
func (s *Service) PutSupplier(ctx context.Context, tenant string, sup Supplier) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var changed bool
		if err := tx.QueryRow(ctx, s.q["PutSupplier"], tenant, sup.Name, sup.IBAN).Scan(&changed); err != nil || !changed {
			return err
		}
		_, _, err := s.Jobs.InvalidateReuse(ctx, tx, jobs.InvalidateReuseParams{
			Kind: Kind, Tenant: tenant, By: "invoice.PutSupplier", Reason: "a supplier's IBAN on file changed",
		})
		return err
	})
}

func (s *Service) supplier(ctx context.Context, tenant, name string) (*Supplier, error) {
	var iban string
	err := s.pool.QueryRow(ctx, s.q["GetSupplier"], tenant, name).Scan(&iban)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &Supplier{Name: name, IBAN: iban}, nil
}

// SetTenantQuota gives tenant a quota of its own.
func (s *Service) SetTenantQuota(ctx context.Context, tenant string, q admission.TenantQuota) error {
	return s.Quotas.SetTenantQuota(ctx, s.pool, tenant, q)
}
