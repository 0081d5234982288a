-- The invoice service's own tables, next to llmq's in the same schema: the
-- documents (OCR text per immutable object version) and the suppliers'
-- master data the validation policy checks against. A host service would
-- keep these in its own schema and object store; the example keeps them
-- small and in Postgres.

-- name: CreateTables
CREATE TABLE IF NOT EXISTS /*schema*/invoice_documents (
    tenant     text        NOT NULL,
    name       text        NOT NULL,
    version    integer     NOT NULL,
    sha256     text        NOT NULL,
    ocr_text   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name, version)
);
CREATE TABLE IF NOT EXISTS /*schema*/invoice_suppliers (
    tenant   text NOT NULL,
    name     text NOT NULL,
    iban     text NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- name: PutDocument
-- A new immutable version of the named document; the same content as the
-- latest version returns that version instead of making another.
WITH latest AS (
    SELECT version, sha256 FROM /*schema*/invoice_documents
    WHERE tenant = $1 AND name = $2
    ORDER BY version DESC LIMIT 1
), ins AS (
    INSERT INTO /*schema*/invoice_documents (tenant, name, version, sha256, ocr_text)
    SELECT $1, $2, coalesce((SELECT version FROM latest), 0) + 1, $3, $4
    WHERE NOT EXISTS (SELECT 1 FROM latest WHERE sha256 = $3)
    ON CONFLICT (tenant, name, version) DO NOTHING
    RETURNING version
)
SELECT version FROM ins
UNION ALL
SELECT version FROM latest WHERE sha256 = $3;

-- name: GetDocument
SELECT sha256, ocr_text FROM /*schema*/invoice_documents
WHERE tenant = $1 AND name = $2 AND version = $3;

-- name: GetDocuments
-- The digest and size of each document version of an upload ($2 names,
-- $3 versions), in one round trip: a primary-key probe per document. The
-- ordinality says which document each row answers (1-based); a version
-- the tenant does not have returns no row. octet_length reads a stored
-- text's size from its header, without decompressing it.
SELECT d.i, s.sha256, octet_length(s.ocr_text)
FROM unnest($2::text[], $3::integer[]) WITH ORDINALITY AS d (name, version, i)
JOIN /*schema*/invoice_documents AS s ON s.tenant = $1 AND s.name = d.name AND s.version = d.version;

-- name: PutSupplier
-- Records a supplier's master data and returns whether it replaced another
-- IBAN on file. Every part of the statement reads the snapshot from before
-- the upsert, so old holds the IBAN it replaces.
WITH old AS (
    SELECT iban FROM /*schema*/invoice_suppliers WHERE tenant = $1 AND name = $2 FOR UPDATE
), put AS (
    INSERT INTO /*schema*/invoice_suppliers (tenant, name, iban) VALUES ($1, $2, $3)
    ON CONFLICT (tenant, name) DO UPDATE SET iban = excluded.iban
)
SELECT coalesce((SELECT iban <> $3 FROM old), false);

-- name: GetSupplier
SELECT iban FROM /*schema*/invoice_suppliers WHERE tenant = $1 AND name = $2;

-- name: MaxEventSeq
-- The highest and lowest seq of the stored events, in either of the
-- outbox's tables (batch rows keep their lowest and highest).
SELECT greatest(coalesce((SELECT max(seq) FROM /*schema*/outbox), 0),
                coalesce((SELECT max(last_seq) FROM /*schema*/outbox_batches), 0)),
       coalesce(least((SELECT min(seq) FROM /*schema*/outbox),
                      (SELECT min(first_seq) FROM /*schema*/outbox_batches)), 0);

-- name: CurrentSnapshot
-- The transactions in progress now (xmin:xmax:xip), taken when the event
-- stream first sees a gap in the outbox sequence. The transaction holding a
-- missing number took it before the number after the gap was taken, and
-- that one has committed, so the holder is in progress now or has ended.
SELECT pg_current_snapshot()::text;

-- name: SnapshotSettled
-- Whether every transaction in progress when the snapshot was taken has
-- ended (committed or rolled back).
SELECT NOT EXISTS (
    SELECT 1 FROM pg_snapshot_xip($1::pg_snapshot) AS x
    WHERE pg_xact_status(x) = 'in progress'
);

-- name: EventsAfter
-- The job lifecycle events after a cursor, every tenant's, in write order:
-- the stream needs to see every sequence number to notice one whose
-- transaction has not committed yet (a gap), so the tenant filter is applied
-- by the reader, like the topic's. llmq's outbox has no change-feed read of its own (see
-- docs/examples.md). Events are read from both of the outbox's tables: the
-- job store writes a statement's events as one batch row when there are
-- several (outbox_batches, whose last_seq index finds the rows holding
-- events above the cursor); an event split out of its row is read as its
-- copy, which has the same seq, and the split is one transaction, so no
-- event is read twice or missed.
SELECT seq, event_id::text, topic, event_type, coalesce(aggregate_id::text, ''),
    coalesce(payload->>'tenant', ''), coalesce(payload->>'kind', ''),
    coalesce((payload->>'state_version')::bigint, 0), coalesce(payload->>'state', ''),
    coalesce(payload->>'batch_id', ''),
    CASE WHEN event_type = 'batch.completed' THEN convert_to(payload::text, 'UTF8') END
FROM (
    SELECT seq, event_id, topic, event_type, aggregate_id, payload
    FROM /*schema*/outbox
    WHERE seq > $1
    UNION ALL
    SELECT (e ->> 'seq')::bigint, (e ->> 'id')::uuid, e ->> 'topic', e ->> 'type', (e ->> 'aggregate')::uuid, (e -> 'payload')::jsonb
    FROM /*schema*/outbox_batches AS b
    CROSS JOIN json_array_elements(b.events) AS e
    WHERE b.last_seq > $1
        AND (e ->> 'seq')::bigint > $1
        AND (e ->> 'seq')::bigint <> ALL (b.split)
) AS events
ORDER BY seq
LIMIT $2;
