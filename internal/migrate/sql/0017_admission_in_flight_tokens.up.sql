-- An in-flight token budget per pool (admission.Pool.MaxInFlightTokens):
-- the tokens (prompt plus max output) reserved by the calls in flight, for
-- local inference servers, whose constraint is the KV cache those calls
-- occupy, not a request count. 0 is no such limit. in_flight_tokens is kept
-- with in_flight by every grant, release and reap, in the same statements.
-- Adding NOT NULL columns with a constant default only changes the
-- catalog. Permits in flight at the upgrade were granted without it; their
-- releases never take the count below zero.
ALTER TABLE /*schema*/admission_pools
    ADD COLUMN max_in_flight_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN in_flight_tokens bigint NOT NULL DEFAULT 0;
