DROP TABLE /*schema*/job_steps;
