DROP INDEX /*schema*/jobs_batch_idx;
ALTER TABLE /*schema*/jobs DROP COLUMN batch_id;
DROP INDEX /*schema*/job_batches_finished_idx;
DROP TABLE /*schema*/job_batches;
