DROP INDEX /*schema*/outbox_published_idx;
DROP INDEX /*schema*/outbox_pending_key_idx;
ALTER TABLE /*schema*/outbox RESET (fillfactor);
DROP TABLE /*schema*/inbox_quarantine;
DROP TABLE /*schema*/inbox;
