DROP TABLE /*schema*/schedule_lease;
DROP TABLE /*schema*/schedules;
