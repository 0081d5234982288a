ALTER TABLE /*schema*/admission_pools
    DROP COLUMN in_flight_tokens,
    DROP COLUMN max_in_flight_tokens;
