ALTER TABLE /*schema*/outbox_batches ALTER COLUMN events TYPE jsonb USING events::jsonb;
