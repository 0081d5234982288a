package llmqtest

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/migrate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
)

//go:embed queries.sql
var queriesSQL string

// DefaultURL is used when DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// MaxSchemas bounds the pooled schemas of one migration set: a test that
// finds them all held by other tests (in this process or another) fails
// saying so.
const MaxSchemas = 200

// URL is DATABASE_URL, or DefaultURL.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's database: a pool and a migrated schema no other test
// uses while this one runs. Its llmq tables are empty but for the rows the
// migrations themselves write.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
}

// Options adjusts NewDB; the zero value is a pool of four connections.
type Options struct {
	// MaxConns sizes the pool, for tests that need real concurrency. At
	// least 4.
	MaxConns int32
}

// NewDB returns a pool and a migrated schema of the test's own, both
// released when the test ends. The schema comes from a pool of migrated
// schemas kept in the database (see the package documentation); an
// unreachable database fails the test with the URL it tried.
func NewDB(t testing.TB, opts ...Options) *DB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("llmqtest: DATABASE_URL %q: %v", URL(), err)
	}
	cfg.MaxConns = max(o.MaxConns, 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("llmqtest: connecting to %s: %v", URL(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("llmqtest: Postgres at %s does not answer: %v", URL(), err)
	}
	// The lock connection stays outside the pool, and is closed (releasing
	// the schema) only after the pool is: Close waits for the test's
	// connections to come back, so nothing the test started still writes
	// when another test takes the schema and clears it.
	lock, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		pool.Close()
		t.Fatalf("llmqtest: connecting to %s: %v", URL(), err)
	}
	t.Cleanup(func() {
		pool.Close()
		_ = lock.Close(context.Background()) // closing the session releases its advisory lock
	})
	prefix, err := schemaPrefix()
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	for i := range MaxSchemas {
		name := fmt.Sprintf("%s_%d", prefix, i)
		var held bool
		if err := lock.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", name).Scan(&held); err != nil {
			t.Fatalf("llmqtest: locking schema %s: %v", name, err)
		}
		if !held {
			continue
		}
		if err := prepare(ctx, pool, name); err != nil {
			t.Fatalf("llmqtest: preparing schema %s: %v", name, err)
		}
		return &DB{Pool: pool, Schema: name}
	}
	t.Fatalf("llmqtest: all %d schemas %s_* are held by running tests", MaxSchemas, prefix)
	return nil
}

// schemaPrefix names the pooled schemas of this build's migrations: their
// latest version and a digest of their SQL, so a schema migrated by other
// SQL (a migration being written) is never reused.
func schemaPrefix() (string, error) {
	schema, err := dbsql.NewSchema("llmqtest")
	if err != nil {
		return "", err
	}
	m, err := migrate.New(schema)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, mig := range m.Migrations() {
		fmt.Fprintf(h, "%d %s\n", mig.Version, mig.Checksum)
	}
	return fmt.Sprintf("llmqtest_v%d_%s", m.Latest(), hex.EncodeToString(h.Sum(nil))[:8]), nil
}

// prepare empties a ready schema, or builds it: drops what a test that
// died half-way left, migrates, and captures the seed rows and the
// function that clears the schema (queries.sql says how).
func prepare(ctx context.Context, pool *pgxpool.Pool, name string) error {
	schema, err := dbsql.NewSchema(name)
	if err != nil {
		return err
	}
	var q statements
	if _, err := q.load(schema); err != nil {
		return err
	}
	var ready bool
	if err := pool.QueryRow(ctx, q.ready, name).Scan(&ready); err != nil {
		return err
	}
	if ready {
		_, err := pool.Exec(ctx, q.clear)
		return err
	}
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
		return err
	}
	m, err := migrate.New(schema)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx, pool, 0); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q.createCapture); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, q.capture, name)
		return err
	})
}

// Jobs returns a job store on the test's schema; cfg.Schema is set for
// it.
func (db *DB) Jobs(t testing.TB, cfg ...jobs.Config) *jobs.PostgresStore {
	t.Helper()
	var c jobs.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.Schema = db.Schema
	store, err := jobs.NewStore(c)
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return store
}

// Outbox returns an outbox store on the test's schema.
func (db *DB) Outbox(t testing.TB) *outbox.Store {
	t.Helper()
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	if err != nil {
		t.Fatalf("llmqtest: %v", err)
	}
	return store
}
