package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/internal/dbtest"
)

// No console statement reads a large table whole: on a schema holding
// 50,000 jobs (enough that the planner's choices are those of a real
// table), the generic plan of every statement, which prepared statements
// end up with, reaches jobs, job_keys, job_attempts, outbox and the usage
// ledger through indexes only.
//
// Then, with realistic parameter values (custom plans, executed), on a
// backlog whose waiting jobs are mostly scheduled for tomorrow: the counts
// read a number of index entries bounded by their cap, not the backlog.
func TestPlansUseIndexes(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	fill(t, db.Pool, db.Schema, 50_000)
	h, err := console.New(console.Config{DB: db.Pool, Schema: db.Schema})
	require.NoError(t, err)
	genericPlans(t, db.Pool, h)
	boundedReads(t, db.Pool, db.Schema, h)
}

func genericPlans(t *testing.T, pool *pgxpool.Pool, h http.Handler) {
	t.Helper()
	large := regexp.MustCompile(`Seq Scan on (jobs|job_keys|job_attempts|outbox|admission_usage)\b`)
	names := console.QueryNamesForTest(h)
	slices.Sort(names)
	for _, name := range names {
		plan := dbtest.GenericPlan(t, pool, console.QueryForTest(h, name))
		require.NotRegexp(t, large, plan, "%s reads a large table whole:\n%s", name, plan)
	}
}

// scheduledBacklog is how many jobs boundedReads schedules for tomorrow:
// far more than any count's cap, so a count that filters them rather than
// skipping them shows.
const scheduledBacklog = 100_000

// boundedReads adds a backlog scheduled for tomorrow (one tenant's, in one
// priority, and a few jobs of many tenants') and runs the counting
// statements with the values the console passes, under EXPLAIN ANALYZE:
// every node reading a large table reads it through an index, and the
// entries all of them read together (returned or filtered out, over every
// loop) stay within a few times the cap.
func boundedReads(t *testing.T, pool *pgxpool.Pool, schema string, h http.Handler) {
	t.Helper()
	ctx := t.Context()
	for _, stmt := range []string{
		`INSERT INTO %[1]s.jobs (id, tenant, kind, queue, priority, payload, state, attempt, max_attempts, fence, available_at, estimated_tokens, created_at, updated_at)
		SELECT gen_random_uuid(), 'big', 'invoice.extract', 'extraction', 1, '{}', 'READY', 0, 5, 0,
			now() + interval '1 day' + i * interval '1 millisecond', 1200, now(), now()
		FROM generate_series(1, $1) AS i`,
		`INSERT INTO %[1]s.jobs (id, tenant, kind, queue, priority, payload, state, attempt, max_attempts, fence, available_at, estimated_tokens, created_at, updated_at)
		SELECT gen_random_uuid(), 's' || (i %% 300), 'webhook.deliver', 'default', (i %% 2)::smallint, '{}', 'RETRY_SCHEDULED', 1, 5, 1,
			now() + interval '1 day', 1200, now(), now()
		FROM generate_series(1, $1 / 10) AS i`,
		`INSERT INTO %[1]s.tenant_queues (queue, tenant) SELECT DISTINCT queue, tenant FROM %[1]s.jobs WHERE $1 > 0 ON CONFLICT DO NOTHING`,
		`ANALYZE %[1]s.jobs`,
	} {
		var args []any
		if strings.Contains(stmt, "$1") {
			args = []any{scheduledBacklog}
		}
		_, err := pool.Exec(ctx, fmt.Sprintf(stmt, schema), args...)
		require.NoError(t, err, stmt)
	}
	const countCap = 1000
	queues := []string{"default", "extraction"}
	since := time.Now().Add(-time.Hour)
	for _, c := range []struct {
		name  string
		args  []any
		bound int64
	}{
		// The console runs the counts under console.RangeScansOnlySQL;
		// without it the planner, estimating a prefix's rows from
		// averages, at times reads the big tenant's 100,000 scheduled
		// entries through a bitmap scan to count 1,000 of them.
		// Per queue: three counts of at most the cap each; the walks over
		// the prefixes, at most the cap each.
		{"QueueCounts", []any{queues, countCap}, 8 * countCap},
		{"QueueCountsTenant", []any{queues, countCap, "big"}, 8 * countCap},
		// A page of 51 rows: each row's counts stop at the cap, overall.
		{"TenantRows", []any{"", "", "", 101, countCap, console.UUIDAtForTest(since), 1000, "", 20_000}, 101 * 6 * countCap / 10},
		{"TenantRows", []any{"big", "", "", 101, countCap, console.UUIDAtForTest(since), 1000, "", 20_000}, 6 * countCap},
		// The filter runs on the window's rows before their counts.
		{"TenantRows", []any{"", "", "", 101, countCap, console.UUIDAtForTest(since), 1000, "%no such tenant%", 20_000}, 0},
		{"Runners", []any{countCap}, countCap},
		{"FinishedPerMinute", []any{60, 5000}, 180 * 5000},
		// The attempts window, its fullness count and a queue probe per
		// attempt in the hour, each at most the scan.
		{"FailureRate", []any{console.UUIDAtForTest(since.Add(-time.Hour)), countCap}, 3 * countCap},
		// The tenant's keys and their count, each at most the scan, and
		// each job's attempts with a queue probe each.
		{"FailureRateTenant", []any{console.UUIDAtForTest(since.Add(-time.Hour)), countCap, "big"}, 8 * countCap},
	} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		if strings.HasPrefix(c.name, "QueueCounts") || c.name == "TenantRows" {
			_, err = tx.Exec(ctx, console.RangeScansOnlySQL)
			require.NoError(t, err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+console.QueryForTest(h, c.name), c.args...)
		require.NoError(t, err, c.name)
		plans, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, c.name)
		require.NoError(t, tx.Rollback(ctx))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal([]byte(plans[0]), &doc), c.name)
		read := doc[0].Plan.largeReads(t, c.name)
		t.Logf("%s %v: %d entries of large tables read (scheduled backlog %d)", c.name, c.args[1:], read, scheduledBacklog)
		require.LessOrEqual(t, read, c.bound, "%s reads more than its bound:\n%s", c.name, plans[0])
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	NodeType         string     `json:"Node Type"`
	Relation         string     `json:"Relation Name"`
	ActualRows       float64    `json:"Actual Rows"`
	ActualLoops      float64    `json:"Actual Loops"`
	RemovedByFilter  float64    `json:"Rows Removed by Filter"`
	RemovedByRecheck float64    `json:"Rows Removed by Index Recheck"`
	Plans            []planNode `json:"Plans"`
}

var largeTables = map[string]bool{"jobs": true, "job_keys": true, "job_attempts": true, "outbox": true, "admission_usage": true}

// largeReads sums the rows the node and its children read from large
// tables (returned or filtered out, over all loops), and fails on a
// sequential scan of one.
func (n planNode) largeReads(t *testing.T, name string) int64 {
	t.Helper()
	var read float64
	if largeTables[n.Relation] {
		require.NotEqual(t, "Seq Scan", n.NodeType, "%s reads %s whole: %+v", name, n.Relation, n)
		read = (n.ActualRows + n.RemovedByFilter + n.RemovedByRecheck) * n.ActualLoops
	}
	total := int64(read)
	for _, c := range n.Plans {
		total += c.largeReads(t, name)
	}
	return total
}
