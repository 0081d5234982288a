package dbsql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/llmqtype"
)

// DBTX is llmqtype.DBTX, defined there so that public packages can take it.
type DBTX = llmqtype.DBTX

// Beginner starts a transaction, or a savepoint within one.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrSavepointLeftOpen marks a WithTx error on a savepoint that could be
// neither rolled back nor released: what fn did may still be part of the
// enclosing transaction and commit with it, so the caller must roll that
// transaction back whole.
var ErrSavepointLeftOpen = errors.New("dbsql: savepoint neither rolled back nor released")

// endTimeout bounds the rollback or release that ends WithTx's transaction
// once ctx has ended.
const endTimeout = 5 * time.Second

// WithTx runs fn inside a transaction begun on db (a savepoint when db is
// already a transaction) and commits it when fn returns nil. Any error from
// fn rolls back only what fn did.
//
// The rollback, and a savepoint's release, run even if ctx ended meanwhile
// (within a few seconds): fn commonly fails because ctx ended, and pgx sends nothing on
// an ended context, which would leave a savepoint's work in the enclosing
// transaction. If a savepoint still cannot be ended, the error wraps
// ErrSavepointLeftOpen.
func WithTx(ctx context.Context, db Beginner, fn func(tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	_, nested := db.(pgx.Tx)
	// The bound on ending starts when fn returns, however long fn took.
	if err := fn(tx); err != nil {
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		defer cancel()
		// A failed rollback of a transaction makes pgx discard the
		// connection, so nothing of it commits; a failed rollback of a
		// savepoint leaves its work in the enclosing transaction.
		if rbErr := tx.Rollback(endCtx); rbErr != nil && nested {
			return fmt.Errorf("%w (%w: rollback: %w)", err, ErrSavepointLeftOpen, rbErr)
		}
		return err
	}
	if !nested {
		// A transaction's commit stays bound to ctx: a caller that gave
		// up should not find its work committed.
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		return nil
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if err := tx.Commit(endCtx); err != nil {
		return fmt.Errorf("%w: release: %w", ErrSavepointLeftOpen, err)
	}
	return nil
}

// BatchSender sends a pipelined batch in one round trip; *pgxpool.Pool,
// *pgx.Conn and pgx.Tx have it, DBTX does not require it.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// CollectUnder runs sql in one round trip after set, a statement of
// transaction-local settings (set_config(..., true)), so that they apply to
// sql's planning and execution, and collects its rows with scan. On a pool
// or a connection the statements form one implicit transaction, and the
// settings end with it. In a caller's transaction (db is a pgx.Tx), which
// they would outlast, restore follows sql in the same round trip and puts
// back what set changed. On a DBTX that cannot send a batch, sql runs
// alone.
func CollectUnder[T any](ctx context.Context, db DBTX, set, restore, sql string, args []any, scan pgx.RowToFunc[T]) ([]T, error) {
	sender, ok := db.(BatchSender)
	if !ok {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, scan)
	}
	b := &pgx.Batch{}
	b.Queue(set)
	b.Queue(sql, args...)
	if _, nested := db.(pgx.Tx); nested {
		b.Queue(restore)
	}
	results := sender.SendBatch(ctx, b)
	collected, err := collectSecond(results, scan)
	// Closing reads the rest of the batch (the restore), whose error is
	// the caller's to see too.
	if err := errors.Join(err, results.Close()); err != nil {
		return nil, err
	}
	return collected, nil
}

// collectSecond reads a batch's first result (the settings) and collects
// the rows of its second.
func collectSecond[T any](results pgx.BatchResults, scan pgx.RowToFunc[T]) ([]T, error) {
	if _, err := results.Exec(); err != nil {
		return nil, err
	}
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}
