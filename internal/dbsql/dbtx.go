package dbsql

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what every llmq store method runs its SQL on: the caller's
// transaction or connection. *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it, so a host service can enqueue a job in the same transaction as
// its own business write, or pass a pool to run a statement on its own.
//
// Begin is part of the seam for the few operations that need several
// statements to be atomic: on a pool or connection it starts a transaction,
// on a pgx.Tx it opens a savepoint, so an llmq failure can be rolled back
// without aborting the caller's transaction.
type DBTX interface {
	Beginner
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts a transaction, or a savepoint within one.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// WithTx runs fn inside a transaction begun on db (a savepoint when db is
// already a transaction) and commits it when fn returns nil. Any error from
// fn rolls back only what fn did.
func WithTx(ctx context.Context, db Beginner, fn func(tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		// The rollback error is secondary: fn's error says what happened, and
		// a failed rollback leaves the connection to be discarded by pgx.
		_ = tx.Rollback(ctx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
