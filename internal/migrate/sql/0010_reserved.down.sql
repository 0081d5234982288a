-- Placeholder: version 10 is another change's number. Migrations must run
-- without gaps, so this no-op holds the place until that change lands, and
-- goes away then.
SELECT 1;
