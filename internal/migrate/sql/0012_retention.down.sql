DROP INDEX /*schema*/jobs_replay_of_idx;
DROP INDEX /*schema*/jobs_finished_idx;
DROP TABLE /*schema*/retention_lease;
