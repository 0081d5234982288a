package llmqtype

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what every llmq store method runs its SQL on: the caller's
// transaction or connection. *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it, so a host can enqueue a job in the same transaction as its own
// business write, or pass a pool to run a statement on its own. Each
// package's DBTX (jobs.DBTX, outbox.DBTX, ...) is this type.
type DBTX interface {
	// Begin starts a transaction on a pool or connection, and a savepoint
	// on a pgx.Tx: the few operations whose statements must be atomic use
	// it, so that an llmq failure rolls back only llmq's work and never
	// aborts the caller's transaction.
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
