-- A quarantine row holds anything a broker can deliver, as it was received:
-- a null body (a Kafka tombstone) stays NULL, distinct from an empty one;
-- the id and the headers are kept as bytes, since PostgreSQL text and
-- jsonb cannot hold invalid UTF-8 or NUL. message_id and headers keep
-- what text can show, for reading in SQL. Nullable columns without a
-- default and DROP NOT NULL only change the catalog: no rewrite.
ALTER TABLE /*schema*/inbox_quarantine
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN raw_message_id    bytea,   -- the id's bytes; NULL when the message had none
    ADD COLUMN raw_header_keys   bytea[], -- every header, in key order, parallel to
    ADD COLUMN raw_header_values bytea[]; -- raw_header_values; NULL on rows written before
