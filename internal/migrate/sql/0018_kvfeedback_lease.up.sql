-- The observer lease of admission/kvfeedback: one row per pool whose
-- in-flight token budget an observer adjusts. Observers may run in every
-- process; only the holder of its pool's row applies the control law, so
-- a decrease is applied once, not once per process. A row of its own
-- rather than columns of admission_pools: renewing the lease every reading
-- must not take the pool row's lock, which every grant cycle waits for.
CREATE TABLE /*schema*/admission_observer_leases (
    pool text PRIMARY KEY,
    holder text NOT NULL,
    lease_until timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
