// Package dbtest gives each test its own freshly migrated Postgres schema on
// the real server at DATABASE_URL, so tests run in parallel without seeing
// each other's rows, and drops it when the test ends. It never mocks Postgres.
package dbtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/migrate"
)

// DefaultURL is used when DATABASE_URL is unset; scripts/services makes it
// work on a fresh machine.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL is DATABASE_URL, or DefaultURL.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's database fixture.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
}

// Options adjusts a fixture; the zero value is a migrated schema behind a
// pool of four connections.
type Options struct {
	// MaxConns sizes the pool, for tests that need real concurrency.
	MaxConns int32
	// Unmigrated leaves the schema uncreated: its name is reserved and
	// dropped at the end, for tests of migration itself.
	Unmigrated bool
	// URL is the server to use instead of DATABASE_URL: a throwaway
	// cluster's (package pgcluster), for a test that stops it.
	URL string
}

// Setup returns a pool and a schema of the test's own, migrated to the
// latest version unless opts says otherwise. Both are cleaned up when the
// test ends. An unreachable database fails the test with the URL it tried.
func Setup(t testing.TB, opts ...Options) *DB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	pool := poolAt(t, cmp.Or(o.URL, URL()), o.MaxConns)
	db := &DB{Pool: pool, Schema: SchemaName(t)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropSchema(ctx, pool, db.Schema); err != nil {
			t.Errorf("dbtest: dropping schema %s: %v", db.Schema, err)
		}
	})
	if o.Unmigrated {
		return db
	}
	schema, err := dbsql.NewSchema(db.Schema)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	m, err := migrate.New(schema)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	if _, err := m.Up(t.Context(), pool, 0); err != nil {
		t.Fatalf("dbtest: migrating schema %s: %v", db.Schema, err)
	}
	return db
}

// Pool opens a pool on URL with maxConns connections (0 means 4), closed
// when the test ends. Every statement run on it with arguments is checked
// for pgx's exec and simple-protocol modes (see textParams): the test fails
// for an argument those modes would encode wrongly.
func Pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return poolAt(t, URL(), maxConns)
}

func poolAt(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("dbtest: database URL %q: %v", url, err)
	}
	cfg.MaxConns = max(maxConns, 4)
	params := newTextParams(cfg.ConnConfig)
	cfg.ConnConfig.Tracer = params
	t.Cleanup(func() { params.finish(t) })
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: connecting to %s: %v", url, err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("dbtest: Postgres at %s does not answer (run scripts/services): %v", url, err)
	}
	return pool
}

// SchemaName returns a fresh schema name for one test.
func SchemaName(t testing.TB) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	return "llmqtest_" + hex.EncodeToString(b[:])
}

// ForExample connects for a testable example and reserves schema, dropping
// it now and again when the returned cleanup runs. Examples have no
// testing.T, so failures panic.
func ForExample(ctx context.Context, schema string) (*pgxpool.Pool, func()) {
	pool, err := pgxpool.New(ctx, URL())
	if err != nil {
		panic(err)
	}
	drop := func(ctx context.Context) {
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			panic(err)
		}
	}
	drop(ctx)
	return pool, func() {
		drop(context.WithoutCancel(ctx))
		pool.Close()
	}
}

// dropSchema drops schema and everything in it. A test that killed a
// process may leave that process's backend finishing a statement on the
// schema's tables for a moment (the server notices the lost client only
// when it next talks to it); the drop can then deadlock with it, and is
// tried again while the deadlock is all that stops it.
func dropSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	const deadlockDetected = "40P01"
	pause := 50 * time.Millisecond
	for {
		_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != deadlockDetected {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (after %w)", err, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// GenericPlan is the plan PostgreSQL would run sql with once it is a
// prepared statement on its generic plan (plan_cache_mode
// force_generic_plan): the plan whose index choice does not depend on the
// values, and the one a statement prepared by pgx ends up with. args are
// SQL literals for its parameters; with none given, each parameter is
// NULL, which a generic plan does not look at. EXPLAIN without ANALYZE
// runs nothing.
func GenericPlan(t testing.TB, pool *pgxpool.Pool, sql string, args ...string) string {
	t.Helper()
	return genericPlan(t, pool, "", sql, args)
}

// GenericPlanAfter is GenericPlan for a statement that runs after setup in
// one transaction, as a limiter cycle's statements run after the statement
// that sets the cycle's options (set_config(..., true)): the plan is made
// under those options. The transaction is rolled back.
func GenericPlanAfter(t testing.TB, pool *pgxpool.Pool, setup, sql string, args ...string) string {
	t.Helper()
	return genericPlan(t, pool, setup, sql, args)
}

func genericPlan(t testing.TB, pool *pgxpool.Pool, setup, sql string, args []string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("dbtest: a connection for a plan: %v", err)
	}
	defer conn.Release()
	if setup != "" {
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatalf("dbtest: %v", err)
		}
		defer func() { _, _ = conn.Exec(ctx, "ROLLBACK") }()
		if _, err := conn.Exec(ctx, setup); err != nil {
			t.Fatalf("dbtest: running %q before the plan: %v", setup, err)
		}
	}
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET plan_cache_mode") }()
	if _, err := conn.Exec(ctx, "PREPARE dbtest_plan AS "+sql); err != nil {
		t.Fatalf("dbtest: preparing %q: %v", sql, err)
	}
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE dbtest_plan") }()
	if len(args) == 0 {
		for range maxParam(sql) {
			args = append(args, "NULL")
		}
	}
	execute := "EXECUTE dbtest_plan"
	if len(args) > 0 {
		execute += "(" + strings.Join(args, ", ") + ")"
	}
	rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+execute)
	if err != nil {
		t.Fatalf("dbtest: explaining %q: %v", sql, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("dbtest: explaining %q: %v", sql, err)
	}
	return strings.Join(lines, "\n")
}

// maxParam is the highest $n in sql.
func maxParam(sql string) int {
	highest := 0
	for _, m := range regexp.MustCompile(`\$(\d+)`).FindAllStringSubmatch(sql, -1) {
		n, _ := strconv.Atoi(m[1])
		highest = max(highest, n)
	}
	return highest
}

// ScannedRows waits until the statistics of schema's table count at least
// n of counter (n_tup_ins, n_tup_upd or n_tup_del: what the sessions under
// test wrote; a session's statistics reach the view at the latest when it
// ends, so close their pool first) and returns how many rows sequential
// scans of the table had read by then.
func ScannedRows(t testing.TB, pool *pgxpool.Pool, schema, table, counter string, n int64) int64 {
	t.Helper()
	switch counter {
	case "n_tup_ins", "n_tup_upd", "n_tup_del":
	default:
		t.Fatalf("dbtest: %q is not a counter of written rows", counter)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var written, scanned int64
		err := pool.QueryRow(context.Background(), `SELECT `+counter+`, seq_tup_read FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&written, &scanned)
		if err != nil {
			t.Fatalf("dbtest: statistics of %s.%s: %v", schema, table, err)
		}
		if written >= n {
			return scanned
		}
		if time.Now().After(deadline) {
			t.Fatalf("dbtest: %s.%s counts %d of %s, not %d: the sessions never reported their statistics", schema, table, written, counter, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OutboxEvents is a FROM item, "(...) AS alias", of every event stored in
// schema's outbox: the single-event rows of outbox and the events of the
// batch rows of outbox_batches (migration 0021), each event once (one
// split out of its batch row is read as its copy), with outbox's columns
// event_id, aggregate_id, topic, key, event_type, payload, headers, seq,
// created_at, attempts and published_at. For tests that count or read
// events in SQL.
func OutboxEvents(schema, alias string) string {
	return `(SELECT event_id, aggregate_id, topic, key, event_type, payload, headers, seq, created_at, attempts, published_at
		FROM ` + schema + `.outbox
		UNION ALL
		SELECT (e ->> 'id')::uuid, (e ->> 'aggregate')::uuid, e ->> 'topic', e ->> 'key', e ->> 'type',
			(e -> 'payload')::jsonb, coalesce((e -> 'headers')::jsonb, '{}'), (e ->> 'seq')::bigint, b.created_at, b.attempts, b.published_at
		FROM ` + schema + `.outbox_batches AS b CROSS JOIN json_array_elements(b.events) AS e
		WHERE (e ->> 'seq')::bigint <> ALL (b.split)) AS ` + alias
}
