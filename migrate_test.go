package llmq_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
)

// allTables are the tables the latest migration leaves, sorted.
var allTables = []string{
	"admission_observer_leases", "admission_permits", "admission_pools", "admission_tenant_quotas", "admission_usage",
	"inbox", "inbox_quarantine", "job_attempts", "job_batches", "job_keys", "job_reuse_invalidations", "job_steps", "jobs", "migrations", "outbox", "outbox_batches", "outbox_relay_lease", "provider_batch_leases",
	"provider_submission_items", "provider_submissions", "retention_lease", "schedule_lease", "schedules",
	"tenant_limits", "tenant_queues",
	"webhook_attempts", "webhook_deliveries", "webhook_endpoint_keys", "webhook_endpoints",
}

func setup(t *testing.T) (*pgxpool.Pool, llmq.MigrateOptions) {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 8, Unmigrated: true})
	return db.Pool, llmq.MigrateOptions{Schema: db.Schema}
}

func tablesIn(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(),
		`SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func TestMigrateConcurrentReplicas(t *testing.T) {
	t.Parallel()
	pool, opts := setup(t)

	const replicas = 5
	results := make([]*llmq.MigrateResult, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { results[i], errs[i] = llmq.Migrate(t.Context(), pool, opts) })
	}
	wg.Wait()

	applied := 0
	for i := range replicas {
		require.NoError(t, errs[i], "replica %d", i)
		applied += len(results[i].Migrations)
	}
	require.Equal(t, llmq.LatestVersion(), applied, "each migration applied by exactly one replica")

	status, err := llmq.MigrationStatus(t.Context(), pool, opts)
	require.NoError(t, err)
	require.Len(t, status, llmq.LatestVersion())
	for _, s := range status {
		require.True(t, s.Applied(), "version %d", s.Version)
		require.True(t, s.Known)
	}
	require.Equal(t, allTables, tablesIn(t, pool, opts.Schema))
}

func TestMigrateDownThenUp(t *testing.T) {
	t.Parallel()
	pool, opts := setup(t)
	ctx := t.Context()

	_, err := llmq.Migrate(ctx, pool, opts)
	require.NoError(t, err)

	again, err := llmq.Migrate(ctx, pool, opts)
	require.NoError(t, err)
	require.Empty(t, again.Migrations, "a second up applies nothing")

	down := opts
	down.Direction = llmq.DirectionDown
	res, err := llmq.Migrate(ctx, pool, down)
	require.NoError(t, err)
	require.Len(t, res.Migrations, llmq.LatestVersion())
	require.Equal(t, []string{"migrations"}, tablesIn(t, pool, opts.Schema))

	status, err := llmq.MigrationStatus(ctx, pool, opts)
	require.NoError(t, err)
	for _, s := range status {
		require.False(t, s.Applied(), "version %d after down", s.Version)
	}

	res, err = llmq.Migrate(ctx, pool, opts)
	require.NoError(t, err)
	require.Len(t, res.Migrations, llmq.LatestVersion())
	require.Equal(t, allTables, tablesIn(t, pool, opts.Schema))
}

// A custom schema in a database of its own: the migration creates only that
// schema, and public is left exactly as it was (empty).
func TestMigrateCustomSchemaLeavesPublicAlone(t *testing.T) {
	t.Parallel()
	admin := dbtest.Pool(t, 1)
	dbName := dbtest.SchemaName(t)
	_, err := admin.Exec(t.Context(), "CREATE DATABASE "+dbName)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+dbName+" WITH (FORCE)")
		require.NoError(t, err)
	})

	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.Database = dbName
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	_, err = llmq.Migrate(t.Context(), pool, llmq.MigrateOptions{Schema: "acme_jobs"})
	require.NoError(t, err)

	require.Equal(t, allTables, tablesIn(t, pool, "acme_jobs"))
	require.Empty(t, tablesIn(t, pool, "public"))
	var objectsInPublic int
	require.NoError(t, pool.QueryRow(t.Context(), `
		SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public'`).Scan(&objectsInPublic))
	require.Zero(t, objectsInPublic, "no relation, index or sequence in public")

	var schemas []string
	rows, err := pool.Query(t.Context(), `
		SELECT nspname FROM pg_namespace
		WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('information_schema', 'public') ORDER BY 1`)
	require.NoError(t, err)
	schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"acme_jobs"}, schemas)
}

func TestMigrateRejectsBadOptions(t *testing.T) {
	t.Parallel()
	pool, opts := setup(t)

	for _, name := range []string{"public", "Upper", "1abc", "pg_llmq", "a-b", "x;drop table jobs", strings.Repeat("a", 49)} {
		_, err := llmq.Migrate(t.Context(), pool, llmq.MigrateOptions{Schema: name})
		require.ErrorIs(t, err, llmq.ErrInvalidSchema, "schema %q", name)
	}

	bad := opts
	bad.TargetVersion = llmq.LatestVersion() + 1
	_, err := llmq.Migrate(t.Context(), pool, bad)
	require.ErrorIs(t, err, llmq.ErrUnknownVersion)
	require.Empty(t, tablesIn(t, pool, opts.Schema), "a rejected call writes nothing")
}

// The SQL printed for external migration tools, run as-is, leaves the schema
// where Migrate would: fully applied and recorded.
func TestMigrationSQLMatchesMigrate(t *testing.T) {
	t.Parallel()
	pool, opts := setup(t)
	ctx := t.Context()

	up, err := llmq.MigrationSQL(opts, 0)
	require.NoError(t, err)
	require.Contains(t, up, opts.Schema+".jobs")
	require.NotContains(t, up, "/*schema*/")
	_, err = pool.Exec(ctx, up)
	require.NoError(t, err)

	status, err := llmq.MigrationStatus(ctx, pool, opts)
	require.NoError(t, err)
	for _, s := range status {
		require.True(t, s.Applied(), "version %d", s.Version)
	}
	res, err := llmq.Migrate(ctx, pool, opts)
	require.NoError(t, err)
	require.Empty(t, res.Migrations)

	downOpts := opts
	downOpts.Direction = llmq.DirectionDown
	down, err := llmq.MigrationSQL(downOpts, llmq.LatestVersion())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, down)
	require.NoError(t, err)
	require.Equal(t, []string{"migrations"}, tablesIn(t, pool, opts.Schema))
}

// A schema migrated from other SQL than this build's for an applied version
// is refused, not built upon.
func TestMigrateRefusesAChangedMigration(t *testing.T) {
	t.Parallel()
	pool, opts := setup(t)
	ctx := t.Context()
	_, err := llmq.Migrate(ctx, pool, opts)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+opts.Schema+".migrations SET checksum = 'edited' WHERE version = 1")
	require.NoError(t, err)

	status, err := llmq.MigrationStatus(ctx, pool, opts)
	require.NoError(t, err)
	require.True(t, status[0].Changed)
	require.False(t, status[1].Changed)

	_, err = llmq.Migrate(ctx, pool, opts)
	require.ErrorIs(t, err, llmq.ErrMigrationChanged)
	down := opts
	down.Direction = llmq.DirectionDown
	_, err = llmq.Migrate(ctx, pool, down)
	require.ErrorIs(t, err, llmq.ErrMigrationChanged)
	require.Contains(t, tablesIn(t, pool, opts.Schema), "jobs", "nothing was reverted")
}
