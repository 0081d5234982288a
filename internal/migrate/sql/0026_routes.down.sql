ALTER TABLE /*schema*/job_steps DROP COLUMN candidate;
ALTER TABLE /*schema*/job_attempts
    DROP COLUMN moves,
    DROP COLUMN model,
    DROP COLUMN candidate;
