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
	case "QueueDepth":
		return s.sql.queueDepth
	case "ListJobs":
		return s.sql.list
	case "SelectJobsByIdempotencyKey":
		return s.sql.selectByKey
	case "ListLeases":
		return s.sql.leases
	case "MarkHungAttempts":
		return s.sql.markHung
	case "UnservedKinds":
		return s.sql.unservedKinds
	case "ReapExpiredLeases":
		return s.sql.reap
	case "FailExpiredDeadlines":
		return s.sql.failDeadlines
	case "TenantBacklogs":
		return s.ops.tenantBacklogs
	case "KindBacklogs":
		return s.ops.kindBacklogs
	}
	panic("unknown statement " + name)
}

// ShareOutForTest runs the claim's batch sharing on tenants given as
// (vtime, weight, cap, running) and returns each one's offer and, of it,
// the low-priority share.
func ShareOutForTest(tenants [][4]float64, limit int, lowShare float64) (given, relaxed []int) {
	cs := make([]*tenantCandidate, len(tenants))
	for i, t := range tenants {
		cs[i] = &tenantCandidate{tenant: string(rune('a' + i)), vtime: t[0], weight: t[1], maxRunning: int(t[2]), running: int(t[3])}
	}
	shareOut(cs, limit, lowShare)
	for _, c := range cs {
		given = append(given, c.given)
		relaxed = append(relaxed, c.relaxed)
	}
	return given, relaxed
}
