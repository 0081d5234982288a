DROP TABLE /*schema*/outbox;
DROP TABLE /*schema*/job_attempts;
DROP TABLE /*schema*/jobs;
