-- Queries of the webhook store. Tables are written /*schema*/name.

-- fragment: endpoint_columns
id, tenant, url, event_types, scheme, send_key_ids, description, status,
    coalesce(disabled_reason, ''), breaker_state, breaker_failures, breaker_until, auth_failures,
    created_at, updated_at,
    ARRAY(SELECT k.key_id FROM /*schema*/webhook_endpoint_keys AS k
          WHERE k.endpoint_id = id AND (k.expires_at IS NULL OR k.expires_at > now())
          ORDER BY k.created_at DESC, k.key_id)

-- name: InsertEndpoint
INSERT INTO /*schema*/webhook_endpoints (id, tenant, url, event_types, scheme, send_key_ids, description)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: InsertKey
-- $4: the secret is sealed (Config.Sealer), not raw.
INSERT INTO /*schema*/webhook_endpoint_keys (endpoint_id, key_id, secret, sealed) VALUES ($1, $2, $3, $4);

-- name: RawKeys
-- Keys whose secrets are stored raw, locked for SealSecrets to seal them.
SELECT endpoint_id, key_id, secret
FROM /*schema*/webhook_endpoint_keys
WHERE NOT sealed
ORDER BY endpoint_id, key_id
LIMIT $1
FOR UPDATE;

-- name: SealKeys
UPDATE /*schema*/webhook_endpoint_keys AS k
SET secret = v.secret, sealed = true
FROM unnest($1::uuid[], $2::text[], $3::bytea[]) AS v (endpoint_id, key_id, secret)
WHERE k.endpoint_id = v.endpoint_id AND k.key_id = v.key_id AND NOT k.sealed;

-- name: ExpireKeys
-- Rotation: the endpoint's current keys (other than the new one, $2) expire
-- after the overlap $3 ms; keys already expiring sooner keep their time.
UPDATE /*schema*/webhook_endpoint_keys
SET expires_at = least(coalesce(expires_at, 'infinity'), now() + $3 * interval '1 millisecond')
WHERE endpoint_id = $1 AND key_id <> $2 AND (expires_at IS NULL OR expires_at > now());

-- name: LockEndpoint
-- Rotations of one endpoint serialise on its row, so two concurrent
-- rotations cannot both expire the other's new key.
SELECT id FROM /*schema*/webhook_endpoints WHERE tenant = $1 AND id = $2 FOR UPDATE;

-- name: GetEndpoint
SELECT /*endpoint_columns*/ FROM /*schema*/webhook_endpoints WHERE tenant = $1 AND id = $2;

-- name: ListEndpoints
-- Served by webhook_endpoints_tenant_idx.
SELECT /*endpoint_columns*/ FROM /*schema*/webhook_endpoints WHERE tenant = $1 ORDER BY id;

-- name: SetStatus
-- Enabling an endpoint also closes its breaker and clears its counters: an
-- operator re-enabling it has fixed what was wrong.
UPDATE /*schema*/webhook_endpoints
SET status = $3,
    disabled_reason = CASE WHEN $3 = 'disabled' THEN $4 END,
    breaker_state = CASE WHEN $3 = 'enabled' THEN 'closed' ELSE breaker_state END,
    breaker_until = CASE WHEN $3 = 'enabled' THEN NULL ELSE breaker_until END,
    breaker_failures = CASE WHEN $3 = 'enabled' THEN 0 ELSE breaker_failures END,
    auth_failures = CASE WHEN $3 = 'enabled' THEN 0 ELSE auth_failures END,
    updated_at = now()
WHERE tenant = $1 AND id = $2;

-- name: SubscribedEndpoints
-- Enqueue's fan-out: the tenant's enabled endpoints subscribed to type $2.
-- webhook_endpoints_tenant_idx narrows to the tenant's rows.
SELECT id FROM /*schema*/webhook_endpoints
WHERE tenant = $1 AND status = 'enabled' AND (event_types @> ARRAY[$2::text] OR event_types @> ARRAY['*'])
ORDER BY id;

-- name: InsertDeliveries
-- One delivery per endpoint; an event already delivered to an endpoint
-- (same event id) is skipped, so enqueueing an event twice delivers it once.
INSERT INTO /*schema*/webhook_deliveries (id, tenant, endpoint_id, event_id, event_type, body)
SELECT d.id, $3, d.endpoint_id, $4, $5, $6
FROM unnest($1::uuid[], $2::uuid[]) AS d (id, endpoint_id)
ON CONFLICT (endpoint_id, event_id) DO NOTHING
RETURNING id, endpoint_id;

-- name: GetDelivery
SELECT d.id, d.tenant, d.endpoint_id, d.event_id, d.event_type, d.body, d.created_at
FROM /*schema*/webhook_deliveries AS d
WHERE d.tenant = $1 AND d.id = $2;

-- name: LoadAttempt
-- Everything one attempt needs, read without locks: the delivery, its
-- endpoint (id, status, URL, scheme, breaker) and the keys signing now. The
-- endpoint is the delivery's, whatever the job payload says.
SELECT e.id, d.body, e.url, e.scheme, e.send_key_ids, e.status, e.breaker_state, e.breaker_until,
    ARRAY(SELECT k.key_id FROM /*schema*/webhook_endpoint_keys AS k
          WHERE k.endpoint_id = e.id AND (k.expires_at IS NULL OR k.expires_at > now())
          ORDER BY k.created_at DESC, k.key_id),
    ARRAY(SELECT k.secret FROM /*schema*/webhook_endpoint_keys AS k
          WHERE k.endpoint_id = e.id AND (k.expires_at IS NULL OR k.expires_at > now())
          ORDER BY k.created_at DESC, k.key_id),
    ARRAY(SELECT k.sealed FROM /*schema*/webhook_endpoint_keys AS k
          WHERE k.endpoint_id = e.id AND (k.expires_at IS NULL OR k.expires_at > now())
          ORDER BY k.created_at DESC, k.key_id)
FROM /*schema*/webhook_deliveries AS d
JOIN /*schema*/webhook_endpoints AS e ON e.id = d.endpoint_id
WHERE d.tenant = $1 AND d.id = $2;

-- name: BreakerAdmit
-- An open breaker whose cool-down has passed lets exactly one dispatcher
-- through as the probe. The UPDATE's row lock serialises dispatchers: the
-- first moves the breaker to half_open, holding it until now + $3 ms (the
-- probe's attempt timeout) so that a probe that dies does not hold it half
-- open for ever; the others find breaker_until in the future and defer. The
-- outer SELECT sees the row as it was before this statement.
WITH admitted AS (
    UPDATE /*schema*/webhook_endpoints
    SET breaker_state = 'half_open', breaker_until = now() + $3 * interval '1 millisecond', updated_at = now()
    WHERE tenant = $1 AND id = $2 AND breaker_state <> 'closed' AND breaker_until <= now()
    RETURNING id
)
SELECT e.breaker_state, e.breaker_until, EXISTS (SELECT FROM admitted), now()
FROM /*schema*/webhook_endpoints AS e
WHERE e.tenant = $1 AND e.id = $2;

-- name: BreakerSuccess
-- Closes the breaker and clears the counters; writes nothing on the common
-- path (already closed and clear), so healthy deliveries cost no update.
UPDATE /*schema*/webhook_endpoints
SET breaker_state = 'closed', breaker_until = NULL, breaker_failures = 0, auth_failures = 0, updated_at = now()
WHERE tenant = $1 AND id = $2
    AND (breaker_state <> 'closed' OR breaker_failures <> 0 OR auth_failures <> 0);

-- name: BreakerFailure
-- One more consecutive failure: a failed probe re-opens the breaker, and the
-- $3-th failure opens it, for the cool-down $4 ms. The row lock orders
-- concurrent dispatchers, so the count is exact.
UPDATE /*schema*/webhook_endpoints
SET breaker_failures = breaker_failures + 1,
    breaker_state = CASE WHEN breaker_state = 'half_open' OR breaker_failures + 1 >= $3 THEN 'open' ELSE breaker_state END,
    breaker_until = CASE WHEN breaker_state = 'half_open' OR breaker_failures + 1 >= $3
        THEN now() + $4 * interval '1 millisecond' ELSE breaker_until END,
    updated_at = now()
WHERE tenant = $1 AND id = $2
RETURNING breaker_state;

-- name: AuthFailure
-- One more consecutive 401/403; the caller alerts when the count reaches its
-- threshold (exactly once per run of failures).
UPDATE /*schema*/webhook_endpoints
SET auth_failures = auth_failures + 1, updated_at = now()
WHERE tenant = $1 AND id = $2
RETURNING auth_failures;

-- name: InsertAttempt
INSERT INTO /*schema*/webhook_attempts (delivery_id, job_id, attempt, worker, url, started_at, latency_ms,
    status, outcome, error_class, error, key_ids, request_headers, response_body)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);

-- name: ListAttempts
-- Served by webhook_attempts_delivery_idx; the join scopes it to the tenant.
SELECT a.delivery_id, a.job_id, a.attempt, a.worker, a.url, a.started_at, a.latency_ms, a.status, a.outcome,
    coalesce(a.error_class, ''), coalesce(a.error, ''), a.key_ids, a.request_headers, coalesce(a.response_body, '')
FROM /*schema*/webhook_attempts AS a
JOIN /*schema*/webhook_deliveries AS d ON d.id = a.delivery_id
WHERE d.tenant = $1 AND a.delivery_id = $2
ORDER BY a.id;

-- name: PruneDeliveries
-- Deliveries created more than $1 ms ago and not kept (delivery_unsent,
-- prune.sql: their job may still send them or be replayed), oldest first,
-- $2 at a time, with their attempts (ON DELETE CASCADE). A kept delivery is
-- skipped, not counted against the limit, so old deliveries still in flight
-- never stop the batches behind them. webhook_deliveries_created_idx serves
-- the range; SKIP LOCKED lets several pruners run at once without waiting.
DELETE FROM /*schema*/webhook_deliveries
WHERE id IN (
    SELECT d.id FROM /*schema*/webhook_deliveries AS d
    WHERE d.created_at < now() - $1 * interval '1 millisecond'
        AND NOT /*delivery_unsent*/
    ORDER BY d.created_at
    LIMIT $2
    FOR UPDATE OF d SKIP LOCKED
);

-- name: BreakerStates
-- Enabled endpoints by breaker state, for the breaker gauge. A scan of
-- webhook_endpoints, one row per registered endpoint (a small table, read
-- at most once per gauge refresh).
SELECT breaker_state, count(*)
FROM /*schema*/webhook_endpoints
WHERE status = 'enabled'
GROUP BY breaker_state;
