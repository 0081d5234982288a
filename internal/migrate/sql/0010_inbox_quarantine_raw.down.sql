-- A null payload becomes empty: the earlier schema cannot tell them apart.
UPDATE /*schema*/inbox_quarantine SET payload = '' WHERE payload IS NULL;
ALTER TABLE /*schema*/inbox_quarantine
    ALTER COLUMN payload SET NOT NULL,
    DROP COLUMN raw_message_id,
    DROP COLUMN raw_header_keys,
    DROP COLUMN raw_header_values;
