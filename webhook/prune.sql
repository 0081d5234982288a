-- Retention of webhook deliveries (see prune.go). Pruning runs
-- PruneDeliveries (queries.sql), the statement Store.Prune runs; attempts
-- follow their delivery by cascade.

-- name: CountDeliveries
-- Deliveries created more than $1 ms ago: what PruneDeliveries would
-- delete. Served by webhook_deliveries_created_idx.
SELECT count(*)
FROM /*schema*/webhook_deliveries
WHERE created_at < now() - $1 * interval '1 millisecond';

-- name: OldestDelivery
-- The oldest delivery's creation time (NULL when none): the first entry of
-- webhook_deliveries_created_idx.
SELECT min(created_at) FROM /*schema*/webhook_deliveries;
