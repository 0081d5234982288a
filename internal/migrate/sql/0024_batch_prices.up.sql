-- A pool's prices for requests served through a provider's batch API, in
-- micro-units per million tokens as input_price and output_price. Zero
-- means half the synchronous price, the discount OpenAI's Batch API and
-- Anthropic's Message Batches both give; set them when a provider's batch
-- price is something else.
--
-- Adding a column with a constant default rewrites nothing (PostgreSQL
-- 11 and later): a brief ACCESS EXCLUSIVE lock on each table, which waits
-- for the limiter's short transactions and is not held across a rewrite.
ALTER TABLE /*schema*/admission_pools
    ADD COLUMN batch_input_price  bigint NOT NULL DEFAULT 0 CHECK (batch_input_price >= 0),
    ADD COLUMN batch_output_price bigint NOT NULL DEFAULT 0 CHECK (batch_output_price >= 0);

-- How many of a ledger row's attempts were provider batch requests, and
-- how much of its cost they were, so the spend of the two paths can be
-- told apart.
ALTER TABLE /*schema*/admission_usage
    ADD COLUMN batch_attempts bigint NOT NULL DEFAULT 0,
    ADD COLUMN batch_cost     bigint NOT NULL DEFAULT 0;
