package jobs

// QueryForTest returns one of the store's rendered statements, so tests can
// EXPLAIN exactly what runs.
func (s *PostgresStore) QueryForTest(name string) string {
	switch name {
	case "CompleteJobs":
		return s.sql.complete
	case "HeartbeatLeases":
		return s.sql.heartbeat
	case "LockClaimTenants":
		return s.sql.lockClaimTenants
	case "ClaimJobs":
		return s.sql.claim
	}
	panic("unknown statement " + name)
}
