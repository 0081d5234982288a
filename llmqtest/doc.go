// Package llmqtest is for a host service's tests of its llmq code: an
// isolated, migrated schema per test that costs a few tens of
// milliseconds, a runner worked until its queues are idle, a typed handler
// run inline, and requirements on what a transaction enqueued. Hosts import
// only this package, jobs and lease; it runs on the real PostgreSQL at
// DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres), never
// on a mock.
//
//	func TestAccept(t *testing.T) {
//		t.Parallel()
//		db := llmqtest.NewDB(t)
//		store := db.Jobs(t)
//		tx, _ := db.Pool.Begin(t.Context())
//		// ... the code under test enqueues on tx ...
//		job, args := llmqtest.RequireEnqueued(t.Context(), t, tx, store, "acme", Extract)
//		llmqtest.WorkUntilIdle(t.Context(), t, db, store, lease.Config{Handlers: handlers})
//	}
//
// # Schemas
//
// NewDB hands each test a schema of its own from a pool of migrated
// schemas kept in the database, as River's riverdbtest does, instead of
// migrating a new one per test. The pooled schemas are named
// llmqtest_v<latest version>_<digest of the migrations' SQL>_<n>, so a
// build with other migrations (one being written) never reuses a schema
// migrated by different SQL. A test takes the first schema it can lock
// with a session advisory lock on its name (pg_try_advisory_lock, on a
// connection of its own held until the test ends), so tests in parallel,
// in one process or in several `go test` processes, never share one, and
// a test that dies leaves no lock behind. That lock belongs to a session,
// so NewDB needs a URL that reaches PostgreSQL itself, not a transaction
// pooler (which would hand the lock's session to other clients); the
// pools of the code under test may go through one. A schema taken for the first
// time is migrated; one taken again is cleared by a function written once,
// when it was migrated: it drops the relations the last test created there
// (a host's own tables), DELETEs every llmq table's rows, children before
// parents, and puts back the rows the migrations wrote (the default tenant
// limits). Sequences are not reset, and functions or types a test created
// remain. DELETE rather than TRUNCATE: TRUNCATE makes new files for every
// table, which cost more than the migration it replaces on a busy machine.
//
// Measured with `go test -run '^$' -bench TestDB -benchtime 30x ./llmqtest/`
// (set-up and clean-up included, on a shared two-core machine under load):
// 25-55 ms per test database from the pool, against 220-340 ms for a
// freshly migrated schema (internal/dbtest), a speed-up of five to eight
// times. Most of what remains is opening the test's pool and its lock
// connection, and the catalog read that finds a test's own tables.
//
// The pooled schemas stay in the database between runs; drop them with
// `DROP SCHEMA ... CASCADE` when a migration set is retired. At most
// MaxSchemas are used at once per migration set.
//
// # Running jobs
//
// WorkUntilIdle runs a real lease.Runner (claims, leases, fenced
// completions) until no job is RUNNING and no job of a served kind is
// eligible within the test backoff's cap, then stops it: a handler that
// fails once is retried before it returns, a job of a kind no handler
// serves is left READY and its kind is logged as having no handler (a
// misspelt kind shows there), a job scheduled later is left alone. Zero Retry and PollInterval get test values (1-20
// ms backoff, 10 ms polls). Inline and InlineJob run a typed handler in the
// test's goroutine through the same adapter as lease.Handle, for the
// handler's own logic, with no database.
//
// # Requirements
//
// RequireEnqueued, RequireNotEnqueued and RequireEvent read through the
// DBTX they are given, so a test passes the transaction under test and
// checks what it wrote before (or without) committing. A failed
// requirement says what there is instead: the kinds the tenant's jobs
// have, the event types there are. Attempts, Steps and Job read a job's
// history, its durable steps and its current row.
package llmqtest
