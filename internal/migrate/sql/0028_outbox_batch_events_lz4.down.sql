ALTER TABLE /*schema*/outbox_batches ALTER COLUMN events SET COMPRESSION default;
