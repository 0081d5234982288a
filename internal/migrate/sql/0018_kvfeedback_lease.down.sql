DROP TABLE /*schema*/admission_observer_leases;
