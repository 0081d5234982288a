ALTER TABLE /*schema*/jobs DROP COLUMN trace_parent;
