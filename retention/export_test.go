package retention

import "github.com/jackc/pgx/v5"

// SetBeforeCommit makes every batch of s call f inside its transaction,
// after the lease fence and the deletes, before the commit.
func SetBeforeCommit(s *Service, f func(pgx.Tx)) { s.beforeCommit = f }
