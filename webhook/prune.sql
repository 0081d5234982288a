-- Retention of webhook deliveries (see prune.go). Pruning runs
-- PruneDeliveries (queries.sql), the statement Store.Prune runs; attempts
-- follow their delivery by cascade.

-- block: delivery_unsent
-- True while delivery d has a job (the first, or a replay: kind
-- webhook.deliver, the delivery id in its payload) in any state but
-- SUCCEEDED: waiting, running or retrying, or finished in a state
-- jobs.Replay replays (FAILED_TERMINAL, REVIEW_REQUIRED, CANCELLED). Age
-- alone must not prune such a delivery: no schedule bounds its life (it
-- waits behind its endpoint's earlier deliveries, one job group per
-- endpoint, for as long as they take, and 401/403 slowdowns and
-- Retry-After stretch its own attempts), and a dead letter keeps its
-- delivery for as long as retention keeps the job, so that its replay
-- finds it. A delivery is due once every job of it has SUCCEEDED or is
-- gone. One probe of jobs_webhook_delivery_idx (migration 0020) per
-- delivery. No lock is needed against a replay racing with retention: the
-- replay's insert holds its source job (the foreign key's KEY SHARE lock)
-- until it commits, so the source cannot be deleted under a replay this
-- statement does not see yet.
EXISTS (
    SELECT FROM /*schema*/jobs AS j
    WHERE j.kind = 'webhook.deliver' AND j.payload ->> 'delivery_id' = d.id::text
        AND j.state <> 'SUCCEEDED'
)

-- name: CountDeliveries
-- What PruneDeliveries would delete with no limit: deliveries created more
-- than $1 ms ago and not kept.
SELECT count(*)
FROM /*schema*/webhook_deliveries AS d
WHERE d.created_at < now() - $1 * interval '1 millisecond'
    AND NOT /*delivery_unsent*/;

-- name: OldestDelivery
-- The oldest delivery's creation time (NULL when none): the first entry of
-- webhook_deliveries_created_idx. It may be a delivery pruning keeps (in
-- flight, or a dead letter's).
SELECT min(created_at) FROM /*schema*/webhook_deliveries;
