-- Queries of the Postgres limiter. Tables are written /*schema*/name; the
-- limiter renders them for its schema once, at construction.
--
-- Why acquire is race-free under READ COMMITTED: it is one UPDATE of one
-- pool row whose WHERE clause checks every dimension (cooldown, in-flight,
-- request bucket, token bucket) against that row's columns only. Postgres
-- evaluates the WHERE on the row version in the statement's snapshot; if
-- that version passes but a concurrent transaction has updated or locked
-- the row, the UPDATE waits for the row lock and then re-evaluates the
-- whole WHERE on the newest committed version (EvalPlanQual) before
-- writing. So every grant is decided on the latest state while holding the
-- row lock, and two grants can never both take the last unit of anything.
-- The SET expressions are computed from that same locked version. Nothing
-- else is read: a join or sub-select of the pool table would be evaluated
-- on the old snapshot and would break this.
--
-- A denial matches no row, so it writes nothing and takes no lock beyond
-- the wait; the limiter then reads the pool (SelectPool) to compute how
-- long to wait.
--
-- Every writing statement turns synchronous_commit off for its own
-- transaction (set_config(..., true)): the pool row's lock is held until
-- commit, and waiting for a WAL flush per grant would cap a hot pool at the
-- disk's flush rate. The cost, documented in doc.go: a Postgres crash may
-- lose the last few hundred milliseconds of limiter writes.

-- name: UpsertPool
-- Creates a pool full, or changes its limits at run time. Levels keep what
-- they had (clamped to the new bursts), so a change neither grants a fresh
-- burst nor takes away what was earned.
INSERT INTO /*schema*/admission_pools AS p (
    name, rpm, tpm, max_in_flight, request_burst, token_burst,
    charge_reserved, refund_uncertain, input_price, output_price, request_level, token_level)
VALUES ($1, $2, $3, $4, $5::integer, $6::bigint, $7, $8, $9, $10, $5::integer, $6::bigint)
ON CONFLICT (name) DO UPDATE SET
    request_level = least(excluded.request_burst,
        /*schema*/admission_level(p.request_level, p.request_burst, p.rpm, p.refilled_at)),
    token_level = least(excluded.token_burst,
        /*schema*/admission_level(p.token_level, p.token_burst, p.tpm, p.refilled_at)),
    refilled_at = greatest(p.refilled_at, now()),
    rpm = excluded.rpm,
    tpm = excluded.tpm,
    max_in_flight = excluded.max_in_flight,
    request_burst = excluded.request_burst,
    token_burst = excluded.token_burst,
    charge_reserved = excluded.charge_reserved,
    refund_uncertain = excluded.refund_uncertain,
    input_price = excluded.input_price,
    output_price = excluded.output_price,
    updated_at = now();

-- name: Acquire
-- $1 pool, $2 tokens, $3 permit id, $4 tenant, $5 holder, $6 permit TTL.
-- One statement: the conditional UPDATE (see the header) and the permit
-- row. The permit is inserted only from the UPDATE's RETURNING, so it
-- exists exactly when the pool row was charged.
WITH granted AS (
    UPDATE /*schema*/admission_pools AS p SET
        request_level = /*schema*/admission_level(p.request_level, p.request_burst, p.rpm, p.refilled_at) - 1,
        token_level = /*schema*/admission_level(p.token_level, p.token_burst, p.tpm, p.refilled_at) - $2::bigint,
        refilled_at = greatest(p.refilled_at, now()),
        in_flight = p.in_flight + 1
    WHERE p.name = $1
      AND p.cooldown_until <= now()
      AND p.in_flight < p.max_in_flight
      AND /*schema*/admission_level(p.request_level, p.request_burst, p.rpm, p.refilled_at) >= 1
      AND /*schema*/admission_level(p.token_level, p.token_burst, p.tpm, p.refilled_at) >= $2::bigint
    -- RETURNING sees the new row: refilled_at is the bucket clock's time of
    -- this grant (never earlier than the previous grant's), which the
    -- permit keeps as acquired_at.
    RETURNING p.name, p.refilled_at
),
permit AS (
    INSERT INTO /*schema*/admission_permits (id, pool, tenant, tokens, holder, acquired_at, expires_at)
    SELECT $3, granted.name, $4, $2, $5, granted.refilled_at, now() + $6::interval
    FROM granted
    RETURNING acquired_at, expires_at
)
SELECT permit.acquired_at, permit.expires_at, set_config('synchronous_commit', 'off', true)
FROM permit;

-- name: SelectPool
-- The pool as of now, for a denied acquire's wait and for the emergency
-- allowance's local copy of the limits. The levels are computed, not
-- stored, values.
SELECT rpm, tpm, max_in_flight, request_burst, token_burst, charge_reserved, refund_uncertain,
    input_price, output_price,
    /*schema*/admission_level(request_level, request_burst, rpm, refilled_at),
    /*schema*/admission_level(token_level, token_burst, tpm, refilled_at),
    in_flight,
    extract(epoch FROM greatest(cooldown_until, now()) - now())::double precision,
    EXISTS (SELECT 1 FROM /*schema*/admission_permits AS e WHERE e.pool = p.name AND e.expires_at <= now())
FROM /*schema*/admission_pools AS p
WHERE name = $1;

-- name: Release
-- $1 permit id, $2 outcome (0 never sent, 1 answered, 2 uncertain), $3
-- input and $4 output tokens the provider reported, $5 the ledger shard.
-- Deleting the permit
-- first makes release and the reaper exclusive: whichever deletes the row
-- adjusts the pool; the other finds no row (DELETE re-checks a row it
-- waited for and skips it if it is gone) and changes nothing. Refunds
-- follow the pool's policy:
--   never sent: the request unit and every reserved token;
--   answered:   reserved minus reported tokens (negative when the provider
--               used more: a debt), or nothing when charge_reserved;
--   uncertain:  no request refund; tokens only when refund_uncertain.
-- A refund never lifts a bucket above its burst.
-- A call that was sent, by a permit with a tenant, is added to the usage
-- ledger in the same statement, from the reported tokens and the pool's
-- prices.
WITH gone AS (
    DELETE FROM /*schema*/admission_permits
    WHERE id = $1
    RETURNING pool, tokens, tenant
),
settled AS (
    UPDATE /*schema*/admission_pools AS p SET
        in_flight = p.in_flight - 1,
        request_level = least(p.request_burst, p.request_level + CASE WHEN $2 = 0 THEN 1 ELSE 0 END),
        token_level = least(p.token_burst, p.token_level + CASE
            WHEN $2 = 0 THEN gone.tokens
            WHEN $2 = 1 AND NOT p.charge_reserved THEN gone.tokens - $3::bigint - $4::bigint
            WHEN $2 = 2 AND p.refund_uncertain THEN gone.tokens - $3::bigint - $4::bigint
            ELSE 0 END)
    FROM gone
    WHERE p.name = gone.pool
    RETURNING gone.tenant, gone.pool, p.input_price, p.output_price
),
ledger AS (
    INSERT INTO /*schema*/admission_usage AS u (
        tenant, pool, day, shard, attempts, uncertain_attempts, input_tokens, output_tokens, cost)
    SELECT tenant, pool, (now() AT TIME ZONE 'UTC')::date, $5, 1, CASE WHEN $2 = 2 THEN 1 ELSE 0 END, $3, $4,
        round(($3::numeric * input_price + $4::numeric * output_price) / 1000000)::bigint
    FROM settled
    WHERE tenant <> '' AND $2 <> 0
    ON CONFLICT (tenant, day, pool, shard) DO UPDATE SET
        attempts = u.attempts + 1,
        uncertain_attempts = u.uncertain_attempts + excluded.uncertain_attempts,
        input_tokens = u.input_tokens + excluded.input_tokens,
        output_tokens = u.output_tokens + excluded.output_tokens,
        cost = u.cost + excluded.cost
)
SELECT set_config('synchronous_commit', 'off', true)
FROM settled;

-- name: SelectUsage
-- A tenant's ledger for a range of UTC days, shards summed, served by the
-- primary key.
SELECT tenant, pool, day, sum(attempts)::bigint, sum(uncertain_attempts)::bigint,
    sum(input_tokens)::bigint, sum(output_tokens)::bigint, sum(cost)::bigint
FROM /*schema*/admission_usage
WHERE tenant = $1 AND day BETWEEN $2 AND $3
GROUP BY tenant, pool, day
ORDER BY day, pool;

-- name: ReapPermits
-- Returns the slots of a pool's expired permits (their holders died or
-- overran the TTL). Their requests and tokens are not refunded: the calls
-- may have reached the provider. Served by admission_permits_expiry_idx.
WITH gone AS (
    DELETE FROM /*schema*/admission_permits
    WHERE pool = $1 AND expires_at <= now()
    RETURNING 1
)
UPDATE /*schema*/admission_pools AS p SET
    in_flight = p.in_flight - (SELECT count(*) FROM gone)
WHERE p.name = $1 AND EXISTS (SELECT 1 FROM gone)
RETURNING (SELECT count(*) FROM gone);

-- name: SetCooldown
-- A cooldown only ever extends: concurrent 429s with different
-- Retry-After values leave the longest.
UPDATE /*schema*/admission_pools SET
    cooldown_until = greatest(cooldown_until, now() + $2::interval)
WHERE name = $1;

-- name: LowerRemaining
-- A provider's remaining-budget headers can only lower a bucket, never
-- raise it: $2 and $3 are NULL for a dimension the provider did not report.
UPDATE /*schema*/admission_pools AS p SET
    request_level = least(/*schema*/admission_level(p.request_level, p.request_burst, p.rpm, p.refilled_at),
        coalesce($2::double precision, 'infinity')),
    token_level = least(/*schema*/admission_level(p.token_level, p.token_burst, p.tpm, p.refilled_at),
        coalesce($3::double precision, 'infinity')),
    refilled_at = greatest(p.refilled_at, now())
WHERE p.name = $1;

-- name: CountPermits
-- Live permits and the pool's counter, which must agree once expired
-- permits are reaped.
SELECT p.in_flight, (SELECT count(*) FROM /*schema*/admission_permits AS e WHERE e.pool = p.name)
FROM /*schema*/admission_pools AS p
WHERE p.name = $1;

-- name: SelectPools
-- Every pool as of now, by name, for operators: SelectPool's columns with
-- the name first.
SELECT name, rpm, tpm, max_in_flight, request_burst, token_burst, charge_reserved, refund_uncertain,
    input_price, output_price,
    /*schema*/admission_level(request_level, request_burst, rpm, refilled_at),
    /*schema*/admission_level(token_level, token_burst, tpm, refilled_at),
    in_flight,
    extract(epoch FROM greatest(cooldown_until, now()) - now())::double precision,
    EXISTS (SELECT 1 FROM /*schema*/admission_permits AS e WHERE e.pool = p.name AND e.expires_at <= now())
FROM /*schema*/admission_pools AS p
ORDER BY name;
