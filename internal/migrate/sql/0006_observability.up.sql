-- The W3C traceparent of the span that accepted the job, so that each
-- attempt's span joins the acceptance's trace. Nullable without a default:
-- the ALTER only changes the catalog, however many jobs exist, and jobs
-- accepted outside a trace store nothing.
ALTER TABLE /*schema*/jobs ADD COLUMN trace_parent text;
