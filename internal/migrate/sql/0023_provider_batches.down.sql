DROP TABLE /*schema*/provider_submission_items;
DROP TABLE /*schema*/provider_submissions;
DROP TABLE /*schema*/provider_batch_leases;
