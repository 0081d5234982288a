package jobs

// StatsQueryForTest returns the rendered QueueStats statement, so tests can
// EXPLAIN exactly what Stats runs.
func (s *PostgresStore) StatsQueryForTest() string { return s.sql.stats }
