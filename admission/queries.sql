-- Queries of the Postgres limiter. Tables are written /*schema*/name; the
-- limiter renders them for its schema once, at construction.
--
-- Grants and releases run in cycles. A process's acquirers and releasers of
-- one pool queue up locally; one cycle at a time per pool sends, in one
-- round trip and one implicit transaction (a pgx batch: one Sync at the
-- end), the statements CycleSetup, ReleaseGroup (when releases are
-- queued) and GrantGroup (when acquires are queued). Each is race-free on
-- its own (see each one); the transaction makes the cycle all or nothing.
-- The pool row's lock is taken while a statement executes, after it was
-- planned, and held until the cycle commits; ReleaseGroup deletes its
-- permits before it takes the lock. So the time other processes wait for
-- the lock is as short as the writes allow.
-- If any statement fails, the whole cycle rolls back: no permit row
-- without its charge, no charge without its permit rows.
--
-- Every cycle turns synchronous_commit off for its own transaction
-- (set_config(..., true)): the pool row's lock is held until commit, and
-- waiting for a WAL flush per cycle would cap a hot pool at the disk's
-- flush rate. The cost, documented in doc.go: a Postgres crash may lose
-- the last few hundred milliseconds of limiter writes. It also sets
-- lock_timeout, so a lock held too long comes back as an error from the
-- server (55P03), which the limiter reports as contention, not as an
-- unreachable database.

-- name: CycleSetup
-- $1 the lock timeout, e.g. '1000ms'. The settings last until the cycle
-- commits. plan_cache_mode: the cycle's statements are planned once per
-- connection; left to choose, Postgres re-plans them on every execution
-- (their generic plans' estimates look worse than they are), and planning
-- GrantGroup costs more than running it.
-- enable_seqscan off: a plan is kept until the connection ends or the
-- table's statistics change (a vacuum or an analyze), and planned while
-- admission_permits was empty (a new schema, or vacuumed empty while the
-- pools were idle) a scan of the whole table is the cheapest plan; it
-- then runs on every cycle while the table fills with live and dead
-- permits, until autovacuum comes (on a server without autovacuum, for
-- the connection's life). Every statement of a cycle reaches its rows by
-- a key (the pool by name, permits by id or by pool and expiry), so none
-- needs a sequential scan (TestCyclePlansProbeThePermitsKey).
SELECT set_config('synchronous_commit', 'off', true), set_config('lock_timeout', $1, true),
    set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true);

-- name: GrantGroup
-- $1 pool, $2 permit ids, $3 tokens, $4 tenants (one element per queued
-- request, in arrival order), $5 holder, $6 permit TTL, $7 whether this is
-- a second try of the cycle.
-- Grants the longest prefix of the requests that the pool can grant
-- together: request n (counting only requests still to be decided) fits
-- when n slots are free, the request bucket holds n units, the token
-- bucket holds the reservations of requests 1..n and, on a pool with an
-- in-flight token budget, that budget's free part holds them too. Tokens
-- are never negative, so each condition, once false, stays false further
-- on: the granted requests are exactly a prefix, first come first served,
-- and a large request is never overtaken by later small ones within a
-- cycle. A request larger than the token burst or the in-flight token
-- budget can never fit and is skipped, so it blocks nobody. The levels are read once and charged once for the whole
-- prefix.
-- Why this is race-free: the pool row is read only in the CTE current,
-- with FOR UPDATE. Under READ COMMITTED, SELECT ... FOR UPDATE waits for
-- any transaction holding the row, then locks and returns its newest
-- committed version (re-evaluated, EvalPlanQual), so every decision below
-- is made on the latest state, under the lock, which is held until the
-- cycle commits. The UPDATE (charged) then finds the row version of the
-- statement's snapshot already superseded, follows it to the newest
-- version (locked by this transaction, so without waiting), and computes
-- its SET from that version's columns plus the CTE values derived from
-- current: nothing read from the older snapshot enters the new row.
-- When the free slots are fewer than the requests, the pool's expired
-- permits are reaped first (their holders died or overran the TTL), and
-- their slots serve this cycle; their requests and tokens are not
-- refunded, since the calls may have reached the provider.
-- On a second try ($7), a request whose permit row already exists was
-- granted by the first try, whose answer was lost (a dropped connection
-- after commit): it is reported granted again and not charged twice. The
-- look-up reads the permits of the ids given (a join per request was
-- planned, on an empty table, as a scan of the table per request, under
-- the pool row's lock), and on a first try a one-time filter skips it.
-- One row per request, in order: its permit's times when granted (NULL
-- otherwise) and the pool's state after the cycle, for denials' waits. No
-- row at all for an unknown pool.
WITH current AS (
    SELECT p.rpm, p.tpm, p.max_in_flight, p.token_burst, p.max_in_flight_tokens AS kv_max,
        /*schema*/admission_level(p.request_level, p.request_burst, p.rpm, p.refilled_at) AS requests,
        /*schema*/admission_level(p.token_level, p.token_burst, p.tpm, p.refilled_at) AS tokens,
        p.max_in_flight - p.in_flight AS slots,
        p.max_in_flight_tokens - p.in_flight_tokens AS kv_free_now,
        p.cooldown_until <= now() AS open,
        extract(epoch FROM greatest(p.cooldown_until, now()) - now())::double precision AS cooldown,
        greatest(p.refilled_at, now()) AS at
    FROM /*schema*/admission_pools AS p
    WHERE p.name = $1
    FOR UPDATE
),
reaped AS (
    -- Served by admission_permits_expiry_idx; skipped (a one-time filter)
    -- while slots and the in-flight token budget suffice for every
    -- request. The expired ids, as an array, probe the primary key: a
    -- semi-join with them can be planned as a scan of the table, under
    -- the pool row's lock. SKIP LOCKED: a permit whose release is deleting
    -- it right now is left to that release, which locks the permit before
    -- the pool row; waiting for it here, under the pool row's lock, would
    -- be a deadlock.
    DELETE FROM /*schema*/admission_permits AS x
    WHERE x.id = ANY (ARRAY(
        SELECT e.id FROM /*schema*/admission_permits AS e
        WHERE e.pool = $1 AND e.expires_at <= now()
          AND (SELECT c.slots < cardinality($2::uuid[])
                   OR (c.kv_max > 0 AND c.kv_free_now < (SELECT sum(t) FROM unnest($3::bigint[]) AS t))
               FROM current AS c)
        FOR UPDATE SKIP LOCKED))
    RETURNING x.tokens
),
pool AS (
    SELECT c.*, c.slots + r.n AS free, r.n AS reaped, c.kv_free_now + r.tokens AS kv_free, r.tokens AS reaped_tokens
    FROM current AS c, (SELECT count(*)::integer AS n, coalesce(sum(tokens), 0)::bigint AS tokens FROM reaped) AS r
),
granted_before AS (
    SELECT x.id, x.acquired_at, x.expires_at
    FROM /*schema*/admission_permits AS x
    WHERE $7::boolean AND x.id = ANY ($2::uuid[])
),
asked AS (
    SELECT a.ord, a.id, a.tokens, a.tenant, e.acquired_at, e.expires_at
    FROM unnest($2::uuid[], $3::bigint[], $4::text[]) WITH ORDINALITY AS a(id, tokens, tenant, ord)
    LEFT JOIN granted_before AS e ON e.id = a.id
),
fresh AS (
    SELECT f.id, f.tokens, f.tenant, row_number() OVER w AS n, sum(f.tokens) OVER w AS cum
    FROM asked AS f, pool
    WHERE f.acquired_at IS NULL AND f.tokens <= pool.token_burst AND (pool.kv_max = 0 OR f.tokens <= pool.kv_max)
    WINDOW w AS (ORDER BY f.ord)
),
granted AS (
    SELECT f.id, f.tokens, f.tenant
    FROM fresh AS f, pool
    WHERE pool.open AND f.n <= pool.free AND f.n <= pool.requests AND f.cum <= pool.tokens
        AND (pool.kv_max = 0 OR f.cum <= pool.kv_free)
),
total AS (
    SELECT count(*)::integer AS n, coalesce(sum(g.tokens), 0)::double precision AS tokens
    FROM granted AS g
),
charged AS (
    UPDATE /*schema*/admission_pools AS p SET
        request_level = pool.requests - total.n,
        token_level = pool.tokens - total.tokens,
        refilled_at = pool.at,
        in_flight = p.in_flight + total.n - pool.reaped,
        in_flight_tokens = greatest(0, p.in_flight_tokens + total.tokens::bigint - pool.reaped_tokens)
    FROM pool, total
    WHERE p.name = $1 AND (total.n > 0 OR pool.reaped > 0)
    -- The bucket clock's time of these grants (never earlier than the
    -- previous grant's), which every permit of the prefix keeps as
    -- acquired_at.
    RETURNING p.refilled_at
),
inserted AS (
    INSERT INTO /*schema*/admission_permits (id, pool, tenant, tokens, holder, acquired_at, expires_at)
    SELECT g.id, $1, g.tenant, g.tokens, $5, c.refilled_at, now() + $6::interval
    FROM granted AS g, charged AS c
    RETURNING id, acquired_at, expires_at
)
SELECT coalesce(i.acquired_at, a.acquired_at), coalesce(i.expires_at, a.expires_at),
    pool.rpm, pool.tpm, pool.max_in_flight, pool.token_burst,
    pool.requests - total.n, pool.tokens - total.tokens, pool.max_in_flight - pool.free + total.n,
    pool.cooldown, pool.kv_max, pool.kv_max - pool.kv_free + total.tokens::bigint
FROM asked AS a
CROSS JOIN pool
CROSS JOIN total
LEFT JOIN inserted AS i ON i.id = a.id
ORDER BY a.ord;

-- name: ReleaseGroup
-- $1 pool, $2 permit ids, $3 outcomes (0 never sent, 1 answered, 2
-- uncertain), $4 input and $5 output tokens the provider reported, $6 the
-- ledger shard.
-- Race-free on its own, as a single statement: the UPDATE's SET computes
-- the new counter and levels from the pool row's own columns plus the
-- deleted permits, so when it waits for the row's lock it re-evaluates on
-- the newest version (EvalPlanQual); only the refund policy (read in
-- refund) comes from the snapshot, and only SetPool changes it.
-- Permits are deleted by primary key (their ids are this process's, all of
-- pool $1), probed with the ids as an array: a join with the unnested ids
-- was planned, on an empty permits table, as a hash join over a scan of
-- the whole table (see CycleSetup). An id given twice counts once, as it
-- did when the delete joined the ids. Deleting the permits first makes
-- release and the reaper exclusive:
-- whichever deletes a row adjusts the pool; the other finds no row and
-- changes nothing, so a release retried after a lost answer refunds
-- nothing twice. Refunds follow the pool's policy:
--   never sent: the request unit and every reserved token;
--   answered:   reserved minus reported tokens (negative when the provider
--               used more: a debt), or nothing when charge_reserved;
--   uncertain:  no request refund; tokens only when refund_uncertain.
-- The cycle's refunds are added together, then clamped once at the bursts:
-- the same as applying them one by one with the debts first.
-- Sent calls of permits with a tenant go to the usage ledger in the same
-- statement, one row per tenant (an upsert may touch a row once per
-- statement), at the pool's prices, each call's cost rounded as before.
WITH settle AS (
    SELECT DISTINCT ON (s.id) s.id, s.result, s.input_tokens, s.output_tokens
    FROM unnest($2::uuid[], $3::smallint[], $4::bigint[], $5::bigint[]) AS s(id, result, input_tokens, output_tokens)
),
deleted AS (
    DELETE FROM /*schema*/admission_permits AS e
    WHERE e.id = ANY ($2::uuid[])
    RETURNING e.id, e.tenant, e.tokens
),
gone AS (
    SELECT d.tenant, d.tokens, s.result, s.input_tokens, s.output_tokens
    FROM deleted AS d
    JOIN settle AS s ON s.id = d.id
),
refund AS (
    SELECT count(*)::integer AS released,
        count(*) FILTER (WHERE g.result = 0)::integer AS requests,
        coalesce(sum(g.tokens), 0)::bigint AS reserved,
        coalesce(sum(CASE
            WHEN g.result = 0 THEN g.tokens
            WHEN g.result = 1 AND NOT p.charge_reserved THEN g.tokens - g.input_tokens - g.output_tokens
            WHEN g.result = 2 AND p.refund_uncertain THEN g.tokens - g.input_tokens - g.output_tokens
            ELSE 0 END), 0)::double precision AS tokens
    FROM gone AS g, /*schema*/admission_pools AS p
    WHERE p.name = $1
),
settled AS (
    UPDATE /*schema*/admission_pools AS p SET
        in_flight = p.in_flight - r.released,
        in_flight_tokens = greatest(0, p.in_flight_tokens - r.reserved),
        request_level = least(p.request_burst, p.request_level + r.requests),
        token_level = least(p.token_burst, p.token_level + r.tokens)
    FROM refund AS r
    WHERE p.name = $1 AND r.released > 0
    RETURNING p.input_price, p.output_price
),
ledger AS (
    INSERT INTO /*schema*/admission_usage AS u (
        tenant, pool, day, shard, attempts, uncertain_attempts, input_tokens, output_tokens, cost)
    SELECT g.tenant, $1, (now() AT TIME ZONE 'UTC')::date, $6, count(*), count(*) FILTER (WHERE g.result = 2),
        sum(g.input_tokens)::bigint, sum(g.output_tokens)::bigint,
        sum(round((g.input_tokens::numeric * s.input_price + g.output_tokens::numeric * s.output_price) / 1000000))::bigint
    FROM gone AS g, settled AS s
    WHERE g.tenant <> '' AND g.result <> 0
    GROUP BY g.tenant
    ON CONFLICT (tenant, day, pool, shard) DO UPDATE SET
        attempts = u.attempts + excluded.attempts,
        uncertain_attempts = u.uncertain_attempts + excluded.uncertain_attempts,
        input_tokens = u.input_tokens + excluded.input_tokens,
        output_tokens = u.output_tokens + excluded.output_tokens,
        cost = u.cost + excluded.cost
)
SELECT r.released FROM refund AS r;

-- name: AcquireOne
-- A cycle of one acquire and nothing else tries this first (after
-- CycleSetup): a plain conditional UPDATE is cheaper than GrantGroup's
-- group machinery, and keeps the row's lock for less time. It is
-- race-free on its own: one UPDATE of one pool row whose WHERE checks every
-- dimension against that row's columns only. If the row version in the
-- statement's snapshot passes but a concurrent transaction has updated or
-- locked the row, the UPDATE waits for the row lock and re-evaluates the
-- whole WHERE on the newest committed version (EvalPlanQual) before
-- writing, so the grant is decided on the latest state under the lock. The
-- SET expressions are computed from that same locked version; nothing else
-- is read (a join or sub-select of the pool table would be evaluated on the
-- old snapshot and would break this). A denial matches no row and writes
-- nothing; the limiter then runs the full cycle for the request, which
-- reaps expired permits if slots are short and explains the denial.
-- $1 pool, $2 tokens, $3 permit id, $4 tenant, $5 holder, $6 permit TTL.
-- One statement: the conditional UPDATE (see the header) and the permit
-- row. The permit is inserted only from the UPDATE's RETURNING, so it
-- exists exactly when the pool row was charged.
WITH granted AS (
    UPDATE /*schema*/admission_pools AS p SET
        request_level = /*schema*/admission_level(p.request_level, p.request_burst, p.rpm, p.refilled_at) - 1,
        token_level = /*schema*/admission_level(p.token_level, p.token_burst, p.tpm, p.refilled_at) - $2::bigint,
        refilled_at = greatest(p.refilled_at, now()),
        in_flight = p.in_flight + 1,
        in_flight_tokens = p.in_flight_tokens + $2::bigint
    WHERE p.name = $1
      AND p.cooldown_until <= now()
      AND p.in_flight < p.max_in_flight
      AND (p.max_in_flight_tokens = 0 OR p.in_flight_tokens + $2::bigint <= p.max_in_flight_tokens)
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

-- name: ReleaseOne
-- A cycle of one release and nothing else: the release as one statement
-- (after CycleSetup), for the same reason as AcquireOne.
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
        in_flight_tokens = greatest(0, p.in_flight_tokens - gone.tokens),
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

-- name: UpsertPool
-- Creates a pool full, or changes its limits at run time. Levels keep what
-- they had (clamped to the new bursts), so a change neither grants a fresh
-- burst nor takes away what was earned.
INSERT INTO /*schema*/admission_pools AS p (
    name, rpm, tpm, max_in_flight, request_burst, token_burst,
    charge_reserved, refund_uncertain, input_price, output_price, request_level, token_level, max_in_flight_tokens,
    batch_input_price, batch_output_price)
VALUES ($1, $2, $3, $4, $5::integer, $6::bigint, $7, $8, $9, $10, $5::integer, $6::bigint, $11, $12, $13)
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
    batch_input_price = excluded.batch_input_price,
    batch_output_price = excluded.batch_output_price,
    max_in_flight_tokens = excluded.max_in_flight_tokens,
    updated_at = now();

-- name: SelectPool
-- The pool as of now, for a denied acquire's wait and for the emergency
-- allowance's local copy of the limits. The levels are computed, not
-- stored, values.
SELECT rpm, tpm, max_in_flight, request_burst, token_burst, charge_reserved, refund_uncertain,
    input_price, output_price, batch_input_price, batch_output_price,
    /*schema*/admission_level(request_level, request_burst, rpm, refilled_at),
    /*schema*/admission_level(token_level, token_burst, tpm, refilled_at),
    in_flight,
    extract(epoch FROM greatest(cooldown_until, now()) - now())::double precision,
    EXISTS (SELECT 1 FROM /*schema*/admission_permits AS e WHERE e.pool = p.name AND e.expires_at <= now()),
    max_in_flight_tokens, in_flight_tokens
FROM /*schema*/admission_pools AS p
WHERE name = $1;

-- name: SelectUsage
-- A tenant's ledger for a range of UTC days, shards summed, served by the
-- primary key.
SELECT tenant, pool, day, sum(attempts)::bigint, sum(uncertain_attempts)::bigint,
    sum(input_tokens)::bigint, sum(output_tokens)::bigint, sum(cost)::bigint, sum(batch_attempts)::bigint,
    sum(batch_cost)::bigint
FROM /*schema*/admission_usage
WHERE tenant = $1 AND day BETWEEN $2 AND $3
GROUP BY tenant, pool, day
ORDER BY day, pool;

-- name: ReapPermits
-- Returns the slots (and in-flight tokens) of a pool's expired permits
-- (their holders died or overran the TTL), for Reap; a grant cycle short
-- of either does the same itself. Their requests and tokens are not
-- refunded to the buckets: the calls may have reached the provider.
-- Served by admission_permits_expiry_idx.
WITH gone AS (
    DELETE FROM /*schema*/admission_permits
    WHERE pool = $1 AND expires_at <= now()
    RETURNING tokens
)
UPDATE /*schema*/admission_pools AS p SET
    in_flight = p.in_flight - (SELECT count(*) FROM gone),
    in_flight_tokens = greatest(0, p.in_flight_tokens - (SELECT sum(tokens) FROM gone))
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
    input_price, output_price, batch_input_price, batch_output_price,
    /*schema*/admission_level(request_level, request_burst, rpm, refilled_at),
    /*schema*/admission_level(token_level, token_burst, tpm, refilled_at),
    in_flight,
    extract(epoch FROM greatest(cooldown_until, now()) - now())::double precision,
    EXISTS (SELECT 1 FROM /*schema*/admission_permits AS e WHERE e.pool = p.name AND e.expires_at <= now()),
    max_in_flight_tokens, in_flight_tokens
FROM /*schema*/admission_pools AS p
ORDER BY name;

-- name: RecordBatchUsage
-- $1 pool, $2 tenants, $3 input tokens, $4 output tokens (one element per
-- provider batch result), $5 shard. Adds the results to the ledger as
-- attempts and batch attempts, their cost to cost and batch_cost, at the
-- pool's batch prices: a zero batch
-- price is half the synchronous one. A pool the limiter does not know
-- (the LEFT JOIN finds no row) records tokens at no cost. Run in the
-- transaction that applies the results, so a result is in the ledger
-- exactly when its item is settled. One upsert per tenant; the shard
-- spreads its row lock as Release's do (admission_usage's primary key).
INSERT INTO /*schema*/admission_usage AS u (
    tenant, pool, day, shard, attempts, batch_attempts, uncertain_attempts, input_tokens, output_tokens, cost, batch_cost)
SELECT c.tenant, $1, (now() AT TIME ZONE 'UTC')::date, $5, c.n, c.n, 0, c.input_tokens, c.output_tokens, c.cost, c.cost
FROM (
    SELECT r.tenant, count(*) AS n, sum(r.input_tokens)::bigint AS input_tokens, sum(r.output_tokens)::bigint AS output_tokens,
        coalesce(sum(round((r.input_tokens::numeric * coalesce(nullif(p.batch_input_price, 0)::numeric, p.input_price / 2.0)
            + r.output_tokens::numeric * coalesce(nullif(p.batch_output_price, 0)::numeric, p.output_price / 2.0)) / 1000000)), 0)::bigint AS cost
    FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS r(tenant, input_tokens, output_tokens)
    LEFT JOIN /*schema*/admission_pools AS p ON p.name = $1
    WHERE r.tenant <> ''
    GROUP BY r.tenant
) AS c
ON CONFLICT (tenant, day, pool, shard) DO UPDATE SET
    attempts = u.attempts + excluded.attempts,
    batch_attempts = u.batch_attempts + excluded.batch_attempts,
    input_tokens = u.input_tokens + excluded.input_tokens,
    output_tokens = u.output_tokens + excluded.output_tokens,
    cost = u.cost + excluded.cost,
    batch_cost = u.batch_cost + excluded.batch_cost;
