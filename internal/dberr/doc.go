// Package dberr tells the database's trouble from a statement's.
//
// An error from PostgreSQL or from pgx says one of two things: the
// statement was refused for what it holds or what it did (a constraint, a
// data exception, a host's trigger), and the same statement would meet the
// same refusal again; or the connection, the server or the session's state
// failed it, and the same statement on a connection that works would
// succeed. Connection reports the second. llmq's components use it to
// decide what a failure is: a runner never records an attempt's outcome as
// the job's fault for the second kind, it tries again (package lease); an
// outbox relay treats the claims it made before as possibly unheard and
// releases them (package outbox).
//
// Guarantees:
//   - Connection is true for every error that is not an answer about the
//     statement: class 08 (connection exception); 57P01, 57P02 and 57P03
//     (the server is shutting down, crashed, or not yet accepting
//     connections); 26000 (a prepared statement the session was supposed
//     to hold is gone) and 42P05 (the session already holds one of that
//     name), which a pooler in transaction mode (PgBouncer) causes when
//     pgx's statement cache meets another server connection; 0A000
//     "cached plan must not change result type", after a table the
//     statement reads changed under a prepared plan (pgx forgets the
//     statement, so the next try prepares it again); and every error of
//     pgx or pgconn that is not a server's answer: a connection that could
//     not be made, was reset or closed, or timed out, and whatever
//     pgconn.SafeToRetry says was never sent.
//   - It is false for nil, for the caller's own cancellation
//     (context.Canceled), and for every other SQLSTATE: those are the
//     statement's, or a conflict (a deadlock, a lock timeout) that callers
//     judge for themselves.
//
// Decisions: a timeout counts as the connection's trouble. A statement
// that takes longer than its caller's bound has usually met a server that
// is restarting or a network that lost packets; a statement that is slow
// for what it holds is bounded by statement_timeout, which the server
// reports as 57014, not as a timeout of the connection.
package dberr
