// Package dberrtest provokes real errors from the PostgreSQL server at
// DATABASE_URL, of both kinds package dberr tells apart, for the tests of
// code that classifies them. Nothing is built by hand: each error is what
// pgx returned for a statement the server failed.
package dberrtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/pgcluster"
)

// Connect opens a connection of the test's own to DATABASE_URL, with pgx's
// default statement cache, closed when the test ends.
func Connect(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbtest.URL())
	if err != nil {
		t.Fatalf("dberrtest: connecting to %s: %v", dbtest.URL(), err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// StmtcacheName is the name pgx's statement cache prepares sql under.
func StmtcacheName(sql string) string {
	digest := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(digest[:24])
}

// Code is err's SQLSTATE, or "" when the server did not answer.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// ConnectionErrors returns errors that are the connection's or the
// server's trouble, by what provoked them: a cached statement the session
// lost (26000) or a name it already holds (42P05), as a pooler in
// transaction mode gives pgx's cache; a cached plan whose table changed
// (0A000); a session the server ended (57P01, pg_terminate_backend, as a
// restart does) and the closed connection after it; a refused connection;
// a statement that timed out. schema is one the test may create a table
// in.
func ConnectionErrors(t testing.TB, schema string) map[string]error {
	t.Helper()
	ctx := t.Context()
	errs := map[string]error{}
	conn := Connect(t)
	const query = "SELECT $1::int + 1"
	var n int
	must(t, conn.QueryRow(ctx, query, 1).Scan(&n))
	_, err := conn.PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll() // behind pgx's back, as the pooler's other server connection
	must(t, err)
	errs["26000 lost prepared statement"] = conn.QueryRow(ctx, query, 1).Scan(&n)

	const other = "SELECT $1::int + 2"
	_, err = conn.PgConn().Exec(ctx, "PREPARE "+StmtcacheName(other)+" AS "+other).ReadAll()
	must(t, err)
	errs["42P05 duplicate prepared statement"] = conn.QueryRow(ctx, other, 1).Scan(&n)

	table := schema + ".dberrtest_changing"
	_, err = conn.Exec(ctx, "CREATE TABLE "+table+" (a int)")
	must(t, err)
	read := "SELECT * FROM " + table + " WHERE a > $1"
	_, err = conn.Exec(ctx, read, 0)
	must(t, err)
	_, err = conn.Exec(ctx, "ALTER TABLE "+table+" ADD COLUMN b int")
	must(t, err)
	_, errs["0A000 cached plan must not change result type"] = conn.Exec(ctx, read, 0)

	victim, killer := Connect(t), Connect(t)
	_, err = killer.Exec(ctx, "SELECT pg_terminate_backend($1)", victim.PgConn().PID())
	must(t, err)
	_, errs["terminated session"] = victim.Exec(ctx, "SELECT 1")
	_, errs["closed connection"] = victim.Exec(ctx, "SELECT 1")

	port, err := pgcluster.FreePort(ctx)
	must(t, err)
	_, errs["refused connection"] = pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port))

	timeoutCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, errs["timeout"] = Connect(t).Exec(timeoutCtx, "SELECT pg_sleep(5)")
	for what, err := range errs {
		if err == nil {
			t.Fatalf("dberrtest: %s: no error", what)
		}
	}
	return errs
}

// StatementErrors returns errors the server gave a statement for what it
// holds or does, by SQLSTATE: a check violation (23514), a division by
// zero (22012), two unsupported features (0A000), and a statement_timeout
// (57014).
func StatementErrors(t testing.TB, schema string) map[string]error {
	t.Helper()
	ctx := t.Context()
	conn := Connect(t)
	_, err := conn.Exec(ctx, "CREATE TABLE "+schema+".dberrtest_checked (a int PRIMARY KEY CHECK (a > 0))")
	must(t, err)
	errs := map[string]error{}
	for what, sql := range map[string]string{
		"23514 check violation":      "INSERT INTO " + schema + ".dberrtest_checked VALUES (-1)",
		"22012 division by zero":     "SELECT 1 / $1::int",
		"0A000 subquery in a check":  "CREATE TEMP TABLE x (a int CHECK (a > (SELECT 1)))",
		"0A000 FOR UPDATE, GROUP BY": "SELECT 1 FROM generate_series(1, 2) g GROUP BY g FOR UPDATE",
		"57014 statement_timeout":    "SET statement_timeout = 10; SELECT pg_sleep(1)",
	} {
		var args []any
		if what == "22012 division by zero" {
			args = []any{0} // bound, so the error comes from a prepared statement
		}
		_, errs[what] = conn.Exec(ctx, sql, args...)
		_, err := conn.Exec(ctx, "RESET statement_timeout")
		must(t, err)
		if errs[what] == nil || Code(errs[what]) != what[:5] {
			t.Fatalf("dberrtest: %s: got %v", what, errs[what])
		}
	}
	return errs
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("dberrtest: %v", err)
	}
}
