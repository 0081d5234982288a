package erp

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/webhook"
)

//go:embed queries.sql
var queriesSQL string

// EventType is the only event the ERP books.
const EventType = "invoice.extract.completed"

// Config configures an ERP.
type Config struct {
	// Schema holds the ERP's tables and the llmq inbox. Default "erp".
	Schema string
	// MeterProvider receives the receivers' metrics. Nil means none.
	MeterProvider metric.MeterProvider
}

// ERP is the receiving service; it is an http.Handler serving
// POST /webhooks/{tenant}.
type ERP struct {
	pool  *pgxpool.Pool
	sql   statements
	inbox *inbox.Store
	mp    metric.MeterProvider

	mu        sync.RWMutex
	receivers map[string]*webhook.Receiver

	down     atomic.Bool
	refused  atomic.Int64
	mismatch atomic.Int64
}

// New builds an ERP on pool.
func New(pool *pgxpool.Pool, cfg Config) (*ERP, error) {
	cfg.Schema = cmp.Or(cfg.Schema, "erp")
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	var sql statements
	if _, err := sql.load(schema); err != nil {
		return nil, fmt.Errorf("erp: %w", err)
	}
	in, err := inbox.NewStore(inbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	return &ERP{pool: pool, sql: sql, inbox: in, mp: cfg.MeterProvider, receivers: map[string]*webhook.Receiver{}}, nil
}

// Migrate creates the ERP's tables (the inbox's come from llmq.Migrate).
func (e *ERP) Migrate(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, e.sql.createTables)
	return err
}

// AddTenant accepts deliveries for tenant signed with keys (the secret the
// tenant got when it registered the ERP's URL).
func (e *ERP) AddTenant(tenant string, keys ...webhook.Key) error {
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: keys})
	if err != nil {
		return err
	}
	rc, err := webhook.NewReceiver(webhook.ReceiverConfig{
		Verifier: v, Inbox: e.inbox, DB: e.pool, Consumer: "erp:" + tenant,
		Handle: func(ctx context.Context, tx pgx.Tx, d webhook.Received) error {
			return e.book(ctx, tx, tenant, d)
		},
		OnDigestMismatch: func(context.Context, webhook.Received) { e.mismatch.Add(1) },
		MeterProvider:    e.mp,
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.receivers[tenant] = rc
	e.mu.Unlock()
	return nil
}

// SetDown starts (true) or ends an outage.
func (e *ERP) SetDown(down bool) { e.down.Store(down) }

// ServeHTTP implements http.Handler.
func (e *ERP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.down.Load() {
		e.refused.Add(1)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "ERP maintenance", http.StatusServiceUnavailable)
		return
	}
	tenant, ok := cutPath(r.URL.Path)
	e.mu.RLock()
	rc := e.receivers[tenant]
	e.mu.RUnlock()
	if !ok || rc == nil {
		http.NotFound(w, r)
		return
	}
	rc.ServeHTTP(w, r)
}

func cutPath(p string) (string, bool) {
	const prefix = "/webhooks/"
	if len(p) <= len(prefix) || p[:len(prefix)] != prefix {
		return "", false
	}
	return p[len(prefix):], true
}

// delivery is the part of the webhook body the ERP reads.
type delivery struct {
	Type string `json:"type"`
	Data struct {
		JobID  string `json:"job_id"`
		Result struct {
			Findings   []json.RawMessage `json:"findings"`
			Extraction struct {
				SupplierName  string `json:"supplier_name"`
				InvoiceNumber string `json:"invoice_number"`
				Currency      string `json:"currency"`
				Total         string `json:"total"`
			} `json:"extraction"`
		} `json:"result"`
	} `json:"data"`
}

// errUnbookable is a delivery the ERP refuses to book: it answers 503 and the
// sender retries, then dead-letters it for a person.
var errUnbookable = errors.New("erp: delivery cannot be booked")

func (e *ERP) book(ctx context.Context, tx pgx.Tx, tenant string, d webhook.Received) error {
	var del delivery
	if err := json.Unmarshal(d.Body, &del); err != nil {
		return fmt.Errorf("%w: %w", errUnbookable, err)
	}
	if del.Type != EventType {
		return nil // not ours to book; acknowledged
	}
	ex := del.Data.Result.Extraction
	if len(del.Data.Result.Findings) > 0 || ex.SupplierName == "" || ex.InvoiceNumber == "" || ex.Total == "" {
		return fmt.Errorf("%w: incomplete or unvalidated extraction", errUnbookable)
	}
	tag, err := tx.Exec(ctx, e.sql.book, tenant, ex.SupplierName, ex.InvoiceNumber, ex.Currency, ex.Total, del.Data.JobID, d.ID)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, e.sql.receipt, d.ID, tenant, del.Data.JobID, tag.RowsAffected() == 1)
	return err
}

// Invoice is one booking.
type Invoice struct {
	Tenant, Supplier, InvoiceNumber, Currency, Total, JobID, DeliveryID string
}

// Invoices returns every booking, oldest first.
func (e *ERP) Invoices(ctx context.Context) ([]Invoice, error) {
	rows, err := e.pool.Query(ctx, e.sql.invoices)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Invoice, error) {
		var i Invoice
		err := r.Scan(invoiceDest(&i)...)
		return i, err
	})
}

// Counts says how many deliveries were accepted (receipts) and how many of
// them booked an invoice, and how many requests the outage refused.
type Counts struct {
	Receipts, Booked, RefusedDown, DigestMismatches int64
}

// Counts reads the ERP's counters.
func (e *ERP) Counts(ctx context.Context) (Counts, error) {
	c := Counts{RefusedDown: e.refused.Load(), DigestMismatches: e.mismatch.Load()}
	err := e.pool.QueryRow(ctx, e.sql.receiptCount).Scan(&c.Receipts, &c.Booked)
	return c, err
}
