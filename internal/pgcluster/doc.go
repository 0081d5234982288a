// Package pgcluster runs a throwaway PostgreSQL cluster of a test's own,
// for tests that stop, restart or crash the database under llmq: the
// shared server the other tests use (DATABASE_URL) is never stopped or
// reconfigured.
//
// New initializes a cluster in the test's temporary directory (initdb,
// trust authentication, no fsync), starts it on a free port of 127.0.0.1
// and stops it when the test ends. Stop shuts it down fast (pg_ctl -m
// fast: sessions are ended, the server checkpoints and exits), Start
// starts it again on the same port with the same data, Restart does both,
// Crash stops it as a power cut would (-m immediate: no checkpoint, and
// the next start recovers from the WAL). URL is the same across restarts,
// so a pool built on it reconnects by itself. FreePort finds a port for
// other servers a test runs.
//
// PostgreSQL refuses to run as root: when the test runs as root, the
// binaries run as the "postgres" OS user, which owns the cluster's
// directory. The binaries are those of pg_ctl on PATH, else of the newest
// /usr/lib/postgresql/*/bin; without them New skips the test and says why.
//
// The server runs as a daemon (pg_ctl), not as a child of the test
// process: a test binary killed outright leaves it running, on a port and
// in a directory of its own, until the machine's temporary files are
// cleaned.
package pgcluster
