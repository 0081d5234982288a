ALTER TABLE /*schema*/jobs DROP COLUMN events;
