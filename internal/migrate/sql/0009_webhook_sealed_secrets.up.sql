-- Whether a key's secret is stored sealed by the host's webhook.SecretSealer
-- (encrypted with a key kept outside the database) rather than raw. Rows
-- written before stay raw until webhook.Store.SealSecrets seals them. A
-- constant default: the ALTER only changes the catalog.
ALTER TABLE /*schema*/webhook_endpoint_keys ADD COLUMN sealed boolean NOT NULL DEFAULT false;
