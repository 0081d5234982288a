DROP INDEX /*schema*/outbox_pending_key_idx;
CREATE INDEX outbox_pending_key_idx ON /*schema*/outbox (key, seq)
    WHERE published_at IS NULL AND key IS NOT NULL;
