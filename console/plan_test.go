package console_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/internal/dbtest"
)

// No console statement reads a large table whole: on a schema holding
// 50,000 jobs (enough that the planner's choices are those of a real
// table), the generic plan of every statement, which prepared statements
// end up with, reaches jobs, job_keys, job_attempts, outbox and the usage
// ledger through indexes only.
func TestPlansUseIndexes(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	fill(t, db.Pool, db.Schema, 50_000)
	h, err := console.New(console.Config{DB: db.Pool, Schema: db.Schema})
	require.NoError(t, err)
	ctx := t.Context()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "RESET plan_cache_mode") }()

	large := regexp.MustCompile(`Seq Scan on (jobs|job_keys|job_attempts|outbox|admission_usage)\b`)
	names := console.QueryNamesForTest(h)
	slices.Sort(names)
	for _, name := range names {
		sql := console.QueryForTest(h, name)
		_, err := conn.Exec(ctx, "PREPARE plan_check AS "+sql)
		require.NoError(t, err, name)
		params := 0
		for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(sql, -1) {
			var n int
			_, _ = fmt.Sscan(m[1], &n)
			params = max(params, n)
		}
		execute := "EXECUTE plan_check"
		if params > 0 {
			execute += "(" + strings.TrimSuffix(strings.Repeat("NULL, ", params), ", ") + ")"
		}
		rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+execute)
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		_, err = conn.Exec(ctx, "DEALLOCATE plan_check")
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.NotRegexp(t, large, plan, "%s reads a large table whole:\n%s", name, plan)
	}
}
