-- The ERP's own tables. An invoice is booked once per (tenant, supplier,
-- invoice number), whatever delivered it and however often: the ERP's
-- idempotency is its business key, next to llmq's inbox, which drops a
-- delivery id seen before.

-- name: CreateTables
CREATE TABLE IF NOT EXISTS /*schema*/erp_invoices (
    tenant         text        NOT NULL,
    supplier       text        NOT NULL,
    invoice_number text        NOT NULL,
    currency       text        NOT NULL,
    total          numeric     NOT NULL,
    job_id         text        NOT NULL,
    delivery_id    text        NOT NULL,
    booked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, supplier, invoice_number)
);
CREATE TABLE IF NOT EXISTS /*schema*/erp_receipts (
    delivery_id text        PRIMARY KEY,
    tenant      text        NOT NULL,
    job_id      text        NOT NULL,
    booked      boolean     NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS /*schema*/erp_uploads (
    tenant          text        NOT NULL,
    batch_id        text        NOT NULL,
    total           integer     NOT NULL,
    succeeded       integer     NOT NULL,
    review_required integer     NOT NULL,
    failed          integer     NOT NULL,
    cancelled       integer     NOT NULL,
    delivery_id     text        NOT NULL,
    closed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, batch_id)
);

-- name: Book
INSERT INTO /*schema*/erp_invoices (tenant, supplier, invoice_number, currency, total, job_id, delivery_id)
VALUES ($1, $2, $3, $4, $5::numeric, $6, $7)
ON CONFLICT (tenant, supplier, invoice_number) DO NOTHING;

-- name: Receipt
INSERT INTO /*schema*/erp_receipts (delivery_id, tenant, job_id, booked) VALUES ($1, $2, $3, $4);

-- name: Invoices
SELECT tenant, supplier, invoice_number, currency, total::text, job_id, delivery_id
FROM /*schema*/erp_invoices ORDER BY booked_at, tenant, invoice_number;

-- name: ReceiptCount
SELECT count(*), count(*) FILTER (WHERE booked) FROM /*schema*/erp_receipts;

-- name: CloseUpload
INSERT INTO /*schema*/erp_uploads (tenant, batch_id, total, succeeded, review_required, failed, cancelled, delivery_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (tenant, batch_id) DO NOTHING;

-- name: Uploads
SELECT tenant, batch_id, total, succeeded, review_required, failed, cancelled, delivery_id
FROM /*schema*/erp_uploads ORDER BY closed_at, tenant, batch_id;
