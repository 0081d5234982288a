package admission

import (
	"context"

	"github.com/google/uuid"

	"github.com/llmq/llmq/internal/dbsql"
)

// QueuedAcquires reports how many acquires wait in pool's queue in this
// process, not yet taken by a cycle: tests use it to know that a waiter
// is queued before they act.
func QueuedAcquires(l *Postgres, pool string) int {
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	if q := l.qs.byPool[pool]; q != nil {
		return len(q.acquires)
	}
	return 0
}

// Runners reports how many runner goroutines l started and how many of
// them still run.
func Runners(l *Postgres) (started, running int) {
	l.qs.mu.Lock()
	defer l.qs.mu.Unlock()
	return l.qs.runners.started, l.qs.runners.running
}

// GrantTwice runs the grant cycle for reqs, then runs it again with the
// same permit ids as the second try after a lost answer does, and returns
// both tries' permits (nil where denied).
func GrantTwice(ctx context.Context, l *Postgres, pool string, reqs []Request) (first, second []*Permit, err error) {
	acquires := make([]*acquireWaiter, len(reqs))
	for i, r := range reqs {
		acquires[i] = &acquireWaiter{req: r, id: uuid.Must(uuid.NewV7())}
	}
	permits := func(res cycleResult) ([]*Permit, error) {
		if res.err != nil {
			return nil, res.err
		}
		out := make([]*Permit, len(acquires))
		for i, v := range l.verdicts(pool, acquires, res) {
			out[i] = v.permit
		}
		return out, nil
	}
	if first, err = permits(l.try(ctx, pool, acquires, nil, false)); err != nil {
		return nil, nil, err
	}
	second, err = permits(l.try(ctx, pool, acquires, nil, true))
	return first, second, err
}

// QueryForTest returns statement name of the package's SQL files as a
// limiter on schema runs it, for plan tests.
func QueryForTest(schema, name string) string {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		panic(err)
	}
	var q statements
	set, err := q.load(s)
	if err != nil {
		panic(err)
	}
	sql, ok := set.SQL(name)
	if !ok {
		panic("admission: no statement " + name)
	}
	return sql
}
