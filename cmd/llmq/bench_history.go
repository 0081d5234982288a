package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/dbsql"
)

//go:embed bench_history.sql
var benchHistorySQL string

// historyStatements are the statements of bench_history.sql.
type historyStatements struct{ fill string }

func (q *historyStatements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{benchHistorySQL},
		dbsql.Exec(&q.fill, "FillHistory", 3),
	)
}

// historyChunk is the jobs one FillHistory statement writes: big enough
// that ten million take a few dozen statements, small enough that one
// statement's memory and WAL stay modest.
const historyChunk = 250_000

// addHistoryFlag adds -history to the bench's flags.
func addHistoryFlag(fs *flag.FlagSet, o *benchOptions) {
	fs.IntVar(&o.history, "history", 0, "drain: finished jobs (with their keys and attempts) written before the backlog, as history a host that never prunes holds; compare -history 10000000 with 0 for the cost of history")
}

// fillHistory writes o.history finished jobs into the bench's schema,
// set-based, and reports progress. The drain's VACUUM ANALYZE that
// follows leaves the table as autovacuum would.
func (b *bench) fillHistory(ctx context.Context) error {
	if b.o.history <= 0 {
		return nil
	}
	schema, err := dbsql.NewSchema(b.schema)
	if err != nil {
		return err
	}
	var q historyStatements
	if _, err := q.load(schema); err != nil {
		return err
	}
	start := time.Now()
	chunks := (b.o.history + historyChunk - 1) / historyChunk
	for i := range chunks {
		n := min(historyChunk, b.o.history-i*historyChunk)
		// Older chunks first, an hour apart, so finish times and ids grow
		// together as they would have.
		agoMs := int64(chunks-1-i) * time.Hour.Milliseconds()
		if _, err := b.pool.Exec(ctx, q.fill, n, agoMs, b.o.tenants); err != nil {
			return fmt.Errorf("llmq bench: writing history: %w", err)
		}
		fmt.Fprintf(b.progress, "llmq bench: history %d of %d finished jobs written (%s)\n",
			min((i+1)*historyChunk, b.o.history), b.o.history, time.Since(start).Round(time.Second))
	}
	return nil
}
