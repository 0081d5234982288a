DROP TABLE /*schema*/webhook_attempts;
DROP TABLE /*schema*/webhook_deliveries;
DROP TABLE /*schema*/webhook_endpoint_keys;
DROP TABLE /*schema*/webhook_endpoints;
