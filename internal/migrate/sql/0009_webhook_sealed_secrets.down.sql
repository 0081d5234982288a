ALTER TABLE /*schema*/webhook_endpoint_keys DROP COLUMN sealed;
