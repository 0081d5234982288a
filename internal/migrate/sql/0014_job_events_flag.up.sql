-- Whether a job writes lifecycle events to the outbox (jobs.Config.
-- KindsWithoutEvents). Decided when the job is accepted and kept on its
-- row, so every later transition honours it whichever process makes it.
-- A NOT NULL column with a constant default only changes the catalog,
-- however many jobs exist: existing jobs keep their events.
ALTER TABLE /*schema*/jobs ADD COLUMN events boolean NOT NULL DEFAULT true;
