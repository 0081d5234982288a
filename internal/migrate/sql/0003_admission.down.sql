DROP TABLE /*schema*/admission_permits;
DROP FUNCTION /*schema*/admission_level(double precision, double precision, double precision, timestamptz);
DROP TABLE /*schema*/admission_pools;
