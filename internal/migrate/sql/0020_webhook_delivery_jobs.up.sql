-- A webhook delivery is pruned only once no job of it can still send it or
-- be replayed (webhook/prune.sql, delivery_unsent): no schedule bounds how
-- long a delivery lives, since it waits behind its endpoint's earlier
-- deliveries and its own retries stretch with 401/403 slowdowns and
-- Retry-After. That check finds a delivery's jobs (the first and its
-- replays) by the delivery id in their payload, and this index answers it
-- with one probe per delivery. Partial: only webhook.deliver jobs have
-- entries, so no other job writes to it on insert or update.
--
-- Built inside the migration's transaction (not CONCURRENTLY): the build
-- reads the jobs table and blocks writes to it (enqueues and completions
-- among them) until it commits; on a large jobs table, migrate at a quiet
-- time.
CREATE INDEX jobs_webhook_delivery_idx ON /*schema*/jobs ((payload ->> 'delivery_id'))
    WHERE kind = 'webhook.deliver';
