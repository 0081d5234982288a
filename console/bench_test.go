package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/internal/dbtest"
)

// BenchmarkPages measures each page's server time (the handler, queries
// and rendering; no network) on a schema holding LLMQ_CONSOLE_BENCH_JOBS
// jobs (default 1,000,000), filled by set-based SQL: 30 days of history
// over 1,000 tenants (one of them a third of the volume), mostly
// SUCCEEDED with dead letters, reviews and cancellations, a live backlog
// of 20,000 waiting, retrying and running jobs (2 % of smaller fills), an attempt row per
// attempted job, the outbox of the last two days and a usage ledger.
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./console/
//
// Filling a million jobs takes a minute or two. Set
// LLMQ_CONSOLE_BENCH_SCHEMA to fill a named schema once and reuse it on
// later runs (it is left in place; drop it by hand).
func BenchmarkPages(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("LLMQ_CONSOLE_BENCH_JOBS"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(b, err, "LLMQ_CONSOLE_BENCH_JOBS")
		n = v
	}
	pool, schema := benchSchema(b, n)
	var dead, tenantJob uuid.UUID
	require.NoError(b, pool.QueryRow(b.Context(), fmt.Sprintf(
		`SELECT id FROM %s.jobs WHERE state = 'FAILED_TERMINAL' AND finished_at < now() - interval '3 days' ORDER BY finished_at DESC LIMIT 1`, schema)).Scan(&dead))
	require.NoError(b, pool.QueryRow(b.Context(), fmt.Sprintf(
		`SELECT id FROM %s.job_keys WHERE tenant = 't7' ORDER BY id DESC LIMIT 1`, schema)).Scan(&tenantJob))
	operator, err := console.New(console.Config{DB: pool, Schema: schema})
	require.NoError(b, err)
	scoped, err := console.New(console.Config{DB: pool, Schema: schema, Tenant: "t7"})
	require.NoError(b, err)
	day := time.Now().UTC().Add(-10 * 24 * time.Hour).Format("2006-01-02T15:04")
	dayEnd := time.Now().UTC().Add(-9 * 24 * time.Hour).Format("2006-01-02T15:04")
	for _, p := range []struct {
		name string
		h    http.Handler
		path string
	}{
		{"overview", operator, "/"},
		{"overview-fragment", operator, "/?fragment=live"},
		{"tenants", operator, "/tenants"},
		{"jobs", operator, "/jobs"},
		{"jobs-state-failed", operator, "/jobs?state=FAILED_TERMINAL"},
		{"jobs-rare-kind", operator, "/jobs?kind=embed.batch&queue=default"},
		{"jobs-no-match", operator, "/jobs?kind=no.such.kind"},
		{"jobs-time-range", operator, "/jobs?from=" + day + "&to=" + dayEnd},
		{"jobs-tenant", operator, "/jobs?tenant=t7"},
		{"jobs-tenant-failed", operator, "/jobs?tenant=t7&state=FAILED_TERMINAL"},
		{"job", operator, "/jobs/" + dead.String()},
		{"dead", operator, "/dead"},
		{"review", operator, "/dead?state=REVIEW_REQUIRED"},
		{"dead-tenant", operator, "/dead?tenant=t7"},
		{"pools", operator, "/pools"},
		{"batches", operator, "/batches"},
		{"reuse", operator, "/reuse"},
		{"scoped-overview", scoped, "/"},
		{"scoped-jobs", scoped, "/jobs"},
		{"scoped-dead", scoped, "/dead"},
		{"scoped-job", scoped, "/jobs/" + tenantJob.String()},
		{"scoped-pools", scoped, "/pools"},
		{"scoped-reuse", scoped, "/reuse"},
	} {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				p.h.ServeHTTP(rec, httptest.NewRequestWithContext(b.Context(), http.MethodGet, p.path, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", p.path, rec.Code, rec.Body.String())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
		})
	}
}

// benchSchema returns a pool and a migrated schema holding n jobs.
func benchSchema(b *testing.B, n int) (*pgxpool.Pool, string) {
	b.Helper()
	ctx := b.Context()
	name := os.Getenv("LLMQ_CONSOLE_BENCH_SCHEMA")
	if name == "" {
		db := dbtest.Setup(b)
		fill(b, db.Pool, db.Schema, n)
		return db.Pool, db.Schema
	}
	pool := dbtest.Pool(b, 4)
	var have bool
	require.NoError(b, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_tables WHERE schemaname = $1 AND tablename = 'jobs')`, name).Scan(&have))
	if have {
		b.Logf("reusing schema %s", name)
		return pool, name
	}
	require.NoError(b, migrateSchema(ctx, pool, name))
	fill(b, pool, name, n)
	return pool, name
}

func fill(b testing.TB, pool *pgxpool.Pool, schema string, n int) {
	b.Helper()
	ctx := b.Context()
	start := time.Now()
	for _, stmt := range fillSQL {
		_, err := pool.Exec(ctx, fmt.Sprintf(stmt, schemaArgs(schema, stmt)...), n)
		require.NoError(b, err, stmt)
	}
	for _, table := range []string{"jobs", "job_keys", "job_attempts", "outbox", "tenant_queues", "admission_usage"} {
		_, err := pool.Exec(ctx, "VACUUM ANALYZE "+schema+"."+table)
		require.NoError(b, err)
	}
	b.Logf("filled %s with %d jobs in %s", schema, n, time.Since(start).Round(time.Second))
}

// schemaArgs repeats the schema name for every %[1]s... of stmt: the
// statements use %[1]s only.
func schemaArgs(schema, _ string) []any { return []any{schema} }

// fillSQL writes the history. $1 is the number of jobs; job i was created
// (30 days)·(1 − i/n) ago, so ids (UUIDv7 built from that time) rise with
// i. The newest 20,000 jobs (2 % of smaller fills) are unfinished.
var fillSQL = []string{
	`INSERT INTO %[1]s.jobs (id, tenant, kind, queue, priority, payload, state, attempt, max_attempts, fence,
		lease_owner, lease_until, attempted_at, available_at, estimated_tokens, result, error_class, last_error,
		created_at, updated_at, finished_at)
	SELECT id, tenant, kind, queue, (i %% 3)::smallint, '{"document":"d"}', state,
		CASE WHEN state = 'READY' THEN 0 ELSE 1 END, 5, CASE WHEN state = 'READY' THEN 0 ELSE 2 END,
		CASE WHEN state IN ('READY') THEN NULL ELSE 'worker-' || (i %% 40) END,
		CASE WHEN state = 'RUNNING' THEN now() + interval '1 minute' END,
		CASE WHEN state = 'READY' THEN NULL ELSE created + interval '1 second' END,
		CASE WHEN state = 'RETRY_SCHEDULED' AND i %% 2 = 0 THEN now() + interval '5 minutes' ELSE created END,
		1200,
		CASE WHEN state IN ('SUCCEEDED', 'REVIEW_REQUIRED') THEN '{"total":"1.00"}'::jsonb END,
		CASE state WHEN 'FAILED_TERMINAL' THEN 'permanent' WHEN 'REVIEW_REQUIRED' THEN 'invalid_output'
			WHEN 'RETRY_SCHEDULED' THEN 'transient' END,
		CASE WHEN state IN ('FAILED_TERMINAL', 'REVIEW_REQUIRED', 'RETRY_SCHEDULED') THEN 'provider answered 400' END,
		created, created,
		CASE WHEN state IN ('SUCCEEDED', 'FAILED_TERMINAL', 'REVIEW_REQUIRED', 'CANCELLED')
			THEN created + (1 + i %% 50) * interval '1 second' END
	FROM (
		SELECT i, created,
			(lpad(to_hex((extract(epoch FROM created) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid AS id,
			CASE WHEN i %% 3 = 0 THEN 'big' ELSE 't' || (i %% 1000) END AS tenant,
			CASE WHEN i %% 5 = 0 THEN 'default' ELSE 'extraction' END AS queue,
			CASE WHEN i %% 5 = 0 THEN (CASE WHEN i %% 997 = 0 THEN 'embed.batch' ELSE 'webhook.deliver' END) ELSE 'invoice.extract' END AS kind,
			CASE
				WHEN i > $1 - least(20000, $1 / 50) THEN (CASE WHEN i %% 40 = 0 THEN 'RUNNING' WHEN i %% 10 = 1 THEN 'RETRY_SCHEDULED' ELSE 'READY' END)
				WHEN i %% 100 < 3 THEN 'FAILED_TERMINAL'
				WHEN i %% 100 = 3 THEN 'REVIEW_REQUIRED'
				WHEN i %% 100 = 4 THEN 'CANCELLED'
				ELSE 'SUCCEEDED'
			END AS state
		FROM (
			SELECT i, now() - interval '30 days' * (1 - i::float8 / $1) AS created, md5(i::text) AS h
			FROM generate_series(1, $1) AS i
		) AS g
	) AS j`,
	`INSERT INTO %[1]s.job_keys (tenant, id) SELECT tenant, id FROM %[1]s.jobs WHERE $1 > 0`,
	`INSERT INTO %[1]s.job_attempts (job_id, attempt, fence, worker, started_at, ended_at, outcome, error_class, error, input_tokens, output_tokens, uncertain)
	SELECT id, 1, 1, lease_owner, attempted_at, coalesce(finished_at, attempted_at + interval '3 seconds'),
		CASE state WHEN 'SUCCEEDED' THEN 'succeeded' WHEN 'FAILED_TERMINAL' THEN 'failed' WHEN 'REVIEW_REQUIRED' THEN 'review_required'
			WHEN 'CANCELLED' THEN 'cancelled' ELSE 'retry_scheduled' END,
		error_class, last_error, 1100, 240, state = 'FAILED_TERMINAL'
	FROM %[1]s.jobs WHERE state NOT IN ('READY', 'RUNNING') AND $1 > 0`,
	`INSERT INTO %[1]s.outbox (event_id, aggregate_id, topic, key, event_type, payload, created_at, published_at)
	SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
		id, 'llmq.jobs', id::text, kind || suffix, '{}', t, CASE WHEN t < now() - interval '2 minutes' THEN t + interval '50 milliseconds' END
	FROM (
		SELECT id, kind, created_at AS t, '.requested' AS suffix, md5(id::text || 'r') AS h FROM %[1]s.jobs WHERE created_at > now() - interval '2 days'
		UNION ALL
		SELECT id, kind, finished_at, '.' || lower(state), md5(id::text || 'f') FROM %[1]s.jobs WHERE finished_at > now() - interval '2 days'
	) AS e
	WHERE $1 > 0`,
	`INSERT INTO %[1]s.tenant_queues (queue, tenant) SELECT DISTINCT queue, tenant FROM %[1]s.jobs WHERE $1 > 0`,
	`INSERT INTO %[1]s.admission_pools (name, rpm, tpm, max_in_flight, request_burst, token_burst, input_price, output_price, request_level, token_level)
	SELECT 'openai-gpt', 6000, 2000000, 64, 100, 200000, 2500000, 10000000, 100, 200000 WHERE $1 > 0`,
	`INSERT INTO %[1]s.admission_usage (tenant, pool, day, shard, attempts, input_tokens, output_tokens, cost)
	SELECT t, 'openai-gpt', current_date - d, s, 30, 33000, 7200, 154500
	FROM (SELECT 't' || g AS t FROM generate_series(0, 999) AS g UNION ALL SELECT 'big') AS tenants,
		generate_series(0, 29) AS d, generate_series(0, 3) AS s
	WHERE $1 > 0`,
}

func migrateSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema})
	return err
}
