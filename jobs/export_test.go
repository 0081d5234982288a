package jobs

import (
	"time"

	"github.com/llmq/llmq/internal/dbsql"
)

// QueryForTest returns one of the store's rendered statements, by its name
// in the SQL files, so tests can EXPLAIN exactly what runs.
func (s *PostgresStore) QueryForTest(name string) string {
	schema, err := dbsql.NewSchema(s.cfg.Schema)
	if err != nil {
		panic(err)
	}
	var q statements
	set, err := q.load(schema)
	if err != nil {
		panic(err)
	}
	sql, ok := set.SQL(name)
	if !ok {
		panic("unknown statement " + name)
	}
	return sql
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

// SetClaimLockTimeoutForTest sets how long a lock-free claim waits for a
// job's row.
func (s *PostgresStore) SetClaimLockTimeoutForTest(d time.Duration) { s.claimLockTimeout = d }

// MovesJSONForTest returns moves as Complete stores them, "" for none.
func MovesJSONForTest(moves []Move) (string, error) {
	text, err := movesJSON(moves)
	if text == nil {
		return "", err
	}
	return *text, err
}
