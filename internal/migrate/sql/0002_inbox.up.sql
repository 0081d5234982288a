-- Durable inbox: one row per (consumer, message id) a receiver accepted, so
-- redeliveries are recognised for as long as the sender may retry.
CREATE TABLE /*schema*/inbox (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_digest text        NOT NULL,                   -- sha256 of the body, hex
    source         jsonb       NOT NULL DEFAULT '{}',      -- queue, or topic/partition/offset
    received_at    timestamptz NOT NULL DEFAULT now(),
    status         text        NOT NULL DEFAULT 'accepted',
    CONSTRAINT inbox_status_check CHECK (status IN ('accepted', 'quarantined')),
    PRIMARY KEY (consumer, message_id)
);

-- The pruner deletes the oldest rows first.
CREATE INDEX inbox_received_idx ON /*schema*/inbox (received_at);

-- Messages a receiver could not accept: a reused id with another payload,
-- or a message without an id or that could not be decoded. Kept for people
-- to look at; never processed.
CREATE TABLE /*schema*/inbox_quarantine (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer       text        NOT NULL,
    message_id     text,                                   -- NULL when the message had none
    payload_digest text        NOT NULL,
    source         jsonb       NOT NULL DEFAULT '{}',
    headers        jsonb       NOT NULL DEFAULT '{}',
    payload        bytea       NOT NULL,                   -- truncated to a bounded size
    reason         text        NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now()
);
