DROP INDEX /*schema*/jobs_batch_idx;
ALTER TABLE /*schema*/jobs DROP COLUMN batch_id;
DROP TABLE /*schema*/job_batches;
