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

-- The outbox relay publishes events sharing a key in write order: an event
-- is claimable only while no earlier unpublished event of its key is held
-- by another relay or waiting out a backoff. This index answers that
-- "earlier unpublished event of the same key?" probe.
CREATE INDEX outbox_pending_key_idx ON /*schema*/outbox (key, seq)
    WHERE published_at IS NULL AND key IS NOT NULL;

-- The pruner deletes published events oldest first.
CREATE INDEX outbox_published_idx ON /*schema*/outbox (published_at)
    WHERE published_at IS NOT NULL;
