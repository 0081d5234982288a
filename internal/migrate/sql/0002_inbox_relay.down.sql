DROP INDEX /*schema*/outbox_published_idx;
DROP INDEX /*schema*/outbox_pending_key_idx;
DROP TABLE /*schema*/inbox_quarantine;
DROP TABLE /*schema*/inbox;
