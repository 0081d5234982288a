// Package migrate applies llmq's embedded, versioned SQL migrations to one
// Postgres schema.
//
// Guarantees:
//   - Each migration runs in its own transaction together with the row that
//     records it in <schema>.migrations, so a migration is either applied and
//     recorded or neither.
//   - Every step first takes a transaction-scoped advisory lock derived from
//     the schema name, then re-reads the applied versions. Any number of
//     replicas may call Up at once: they serialise on the lock, and each step
//     is applied exactly once. The lock is transaction-scoped, so a crashed
//     migrator never leaves it held, and session-pooling proxies are not
//     needed.
//   - Versions applied by a newer build are left alone by Up and reported by
//     Status; Down refuses to revert a version it has no SQL for.
//   - Each applied migration records a checksum of its SQL. Up and Down
//     refuse to work on a schema whose applied migrations were built from
//     other SQL than this build's (ErrMigrationChanged): released migrations
//     are never edited, only added.
//   - Nothing outside the chosen schema is created or changed.
package migrate
