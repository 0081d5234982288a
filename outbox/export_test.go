package outbox

import "time"

// StandbyWait is one wait of a standby of r that saw the leader lease
// expire in expiresIn.
func StandbyWait(r *Relay, expiresIn time.Duration) time.Duration { return r.standbyWait(expiresIn) }

// SetClaimLockTimeout sets how long r's lock-free claims wait for a row.
func SetClaimLockTimeout(r *Relay, d time.Duration) { r.lockTimeout = d }

// ClaimSQL is the claim statement s runs, lock-free or skipping
// locked rows, for tests to EXPLAIN.
func ClaimSQL(s *Store, skipLocked bool) string {
	if skipLocked {
		return s.sql.claimEventsSkippingLocked
	}
	return s.sql.claimEvents
}

// ClaimBatchSQL is the statement that claims a batch row, for tests to
// EXPLAIN.
func ClaimBatchSQL(s *Store) string { return s.sql.claimBatches }

// ReleaseOwnClaimsSQL is the statement with which a relay releases its own
// claims, for tests to EXPLAIN.
func ReleaseOwnClaimsSQL(s *Store) string { return s.sql.releaseOwnClaims }
