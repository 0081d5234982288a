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

	"github.com/llmq/llmq/examples/internal/sqlfile"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/webhook"
)

//go:embed queries.sql
var queriesSQL string

// The events the ERP takes: EventType books an invoice, UploadEventType
// closes an upload.
const (
	EventType       = "invoice.extract.completed"
	UploadEventType = "invoice.batch.completed"
)

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
	q     sqlfile.Queries
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
	q, err := sqlfile.Load(cfg.Schema, queriesSQL)
	if err != nil {
		return nil, err
	}
	in, err := inbox.NewStore(inbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	return &ERP{pool: pool, q: q, inbox: in, mp: cfg.MeterProvider, receivers: map[string]*webhook.Receiver{}}, nil
}

// Migrate creates the ERP's tables (the inbox's come from llmq.Migrate).
func (e *ERP) Migrate(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, e.q["CreateTables"])
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

// upload is the body of an upload's webhook.
type upload struct {
	Data struct {
		BatchID        string `json:"batch_id"`
		Total          int    `json:"total"`
		Succeeded      int    `json:"succeeded"`
		ReviewRequired int    `json:"review_required"`
		Failed         int    `json:"failed"`
		Cancelled      int    `json:"cancelled"`
	} `json:"data"`
}

func (e *ERP) book(ctx context.Context, tx pgx.Tx, tenant string, d webhook.Received) error {
	var del delivery
	if err := json.Unmarshal(d.Body, &del); err != nil {
		return fmt.Errorf("%w: %w", errUnbookable, err)
	}
	if del.Type == UploadEventType {
		return e.closeUpload(ctx, tx, tenant, d)
	}
	if del.Type != EventType {
		return nil // not ours to book; acknowledged
	}
	ex := del.Data.Result.Extraction
	if len(del.Data.Result.Findings) > 0 || ex.SupplierName == "" || ex.InvoiceNumber == "" || ex.Total == "" {
		return fmt.Errorf("%w: incomplete or unvalidated extraction", errUnbookable)
	}
	tag, err := tx.Exec(ctx, e.q["Book"], tenant, ex.SupplierName, ex.InvoiceNumber, ex.Currency, ex.Total, del.Data.JobID, d.ID)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, e.q["Receipt"], d.ID, tenant, del.Data.JobID, tag.RowsAffected() == 1)
	return err
}

// closeUpload records that an upload is finished, once per upload (its
// batch id is the ERP's key, as the invoice number is for a booking).
func (e *ERP) closeUpload(ctx context.Context, tx pgx.Tx, tenant string, d webhook.Received) error {
	var u upload
	if err := json.Unmarshal(d.Body, &u); err != nil || u.Data.BatchID == "" {
		return fmt.Errorf("%w: an upload without its batch id: %w", errUnbookable, err)
	}
	_, err := tx.Exec(ctx, e.q["CloseUpload"], tenant, u.Data.BatchID, u.Data.Total, u.Data.Succeeded,
		u.Data.ReviewRequired, u.Data.Failed, u.Data.Cancelled, d.ID)
	return err
}

// Upload is a finished upload the ERP was told of.
type Upload struct {
	Tenant, BatchID, DeliveryID                         string
	Total, Succeeded, ReviewRequired, Failed, Cancelled int
}

// Uploads returns every upload the ERP was told of, oldest first.
func (e *ERP) Uploads(ctx context.Context) ([]Upload, error) {
	rows, err := e.pool.Query(ctx, e.q["Uploads"])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Upload, error) {
		var u Upload
		err := r.Scan(&u.Tenant, &u.BatchID, &u.Total, &u.Succeeded, &u.ReviewRequired, &u.Failed, &u.Cancelled, &u.DeliveryID)
		return u, err
	})
}

// Invoice is one booking.
type Invoice struct {
	Tenant, Supplier, InvoiceNumber, Currency, Total, JobID, DeliveryID string
}

// Invoices returns every booking, oldest first.
func (e *ERP) Invoices(ctx context.Context) ([]Invoice, error) {
	rows, err := e.pool.Query(ctx, e.q["Invoices"])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Invoice, error) {
		var i Invoice
		err := r.Scan(&i.Tenant, &i.Supplier, &i.InvoiceNumber, &i.Currency, &i.Total, &i.JobID, &i.DeliveryID)
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
	err := e.pool.QueryRow(ctx, e.q["ReceiptCount"]).Scan(&c.Receipts, &c.Booked)
	return c, err
}
