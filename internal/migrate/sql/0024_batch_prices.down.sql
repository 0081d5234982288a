ALTER TABLE /*schema*/admission_usage DROP COLUMN batch_cost, DROP COLUMN batch_attempts;
ALTER TABLE /*schema*/admission_pools
    DROP COLUMN batch_output_price,
    DROP COLUMN batch_input_price;
