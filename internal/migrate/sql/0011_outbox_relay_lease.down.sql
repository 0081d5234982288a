DROP TABLE /*schema*/outbox_relay_lease;
