-- Webhook endpoints a tenant registered. Deliveries go only to these rows'
-- URLs, never to a URL taken from an event.
CREATE TABLE /*schema*/webhook_endpoints (
    id               uuid        PRIMARY KEY,
    tenant           text        NOT NULL,
    url              text        NOT NULL,
    event_types      text[]      NOT NULL,                 -- subscribed event types; '*' subscribes to all
    scheme           text        NOT NULL DEFAULT 'v1',    -- signature layout: v1 (Standard Webhooks) or t1
    send_key_ids     boolean     NOT NULL DEFAULT false,   -- also send webhook-key-id
    description      text        NOT NULL DEFAULT '',
    status           text        NOT NULL DEFAULT 'enabled',
    disabled_reason  text,
    -- The circuit breaker, shared by every dispatcher through this row:
    -- closed (deliver), open (defer everything until breaker_until), or
    -- half_open (one probe holds the breaker until breaker_until; the others
    -- defer). breaker_failures counts consecutive failures that say the
    -- endpoint is unhealthy (timeouts, connection errors, 408, 5xx).
    breaker_state    text        NOT NULL DEFAULT 'closed',
    breaker_failures integer     NOT NULL DEFAULT 0,
    breaker_until    timestamptz,
    auth_failures    integer     NOT NULL DEFAULT 0,       -- consecutive 401/403 answers
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_endpoints_status_check CHECK (status IN ('enabled', 'disabled')),
    CONSTRAINT webhook_endpoints_scheme_check CHECK (scheme IN ('v1', 't1')),
    CONSTRAINT webhook_endpoints_breaker_check CHECK (
        breaker_state IN ('closed', 'open', 'half_open')
        AND (breaker_state = 'closed') = (breaker_until IS NULL))
);

-- Listing a tenant's endpoints, and Enqueue's "enabled endpoints of this
-- tenant" lookup (the subscription filter on event_types runs over the few
-- rows one tenant has, so it needs no index of its own).
CREATE INDEX webhook_endpoints_tenant_idx ON /*schema*/webhook_endpoints (tenant, id);

-- Signing keys. An endpoint signs with every key that has not expired: after
-- a rotation the old key keeps signing until expires_at (the overlap), so
-- receivers can switch secrets without losing a delivery.
CREATE TABLE /*schema*/webhook_endpoint_keys (
    endpoint_id uuid        NOT NULL REFERENCES /*schema*/webhook_endpoints (id) ON DELETE CASCADE,
    key_id      text        NOT NULL,
    secret      bytea       NOT NULL,                      -- raw HMAC key; the signer needs it in clear
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,                               -- NULL: current
    PRIMARY KEY (endpoint_id, key_id)
);

-- One row per (event, endpoint): the delivery id is the webhook-id every
-- attempt and every replay carries, so receivers deduplicate on it. The body
-- is kept as the exact bytes sent.
CREATE TABLE /*schema*/webhook_deliveries (
    id          uuid        PRIMARY KEY,
    tenant      text        NOT NULL,
    endpoint_id uuid        NOT NULL REFERENCES /*schema*/webhook_endpoints (id) ON DELETE CASCADE,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- An event is delivered once per endpoint however often it is enqueued:
    -- Enqueue inserts ON CONFLICT DO NOTHING on this key.
    CONSTRAINT webhook_deliveries_event_key UNIQUE (endpoint_id, event_id)
);

-- The pruner deletes the oldest deliveries first (their attempts follow by
-- cascade, through webhook_attempts_delivery_idx).
CREATE INDEX webhook_deliveries_created_idx ON /*schema*/webhook_deliveries (created_at);

-- One row per HTTP attempt, never folded: what was sent (headers, key ids),
-- what came back (status, a bounded body), how long it took, and why it
-- failed.
CREATE TABLE /*schema*/webhook_attempts (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id     uuid        NOT NULL REFERENCES /*schema*/webhook_deliveries (id) ON DELETE CASCADE,
    job_id          uuid        NOT NULL,
    attempt         integer     NOT NULL,                  -- the job's attempt number
    worker          text        NOT NULL DEFAULT '',
    url             text        NOT NULL,
    started_at      timestamptz NOT NULL,
    latency_ms      double precision NOT NULL,
    status          integer,                               -- NULL when no response arrived
    outcome         text        NOT NULL,                  -- delivered | retry | failed | disabled
    error_class     text,
    error           text,
    key_ids         text[]      NOT NULL,
    request_headers jsonb       NOT NULL,
    response_body   text
);

-- A delivery's attempt history, in order.
CREATE INDEX webhook_attempts_delivery_idx ON /*schema*/webhook_attempts (delivery_id, id);
