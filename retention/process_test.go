package retention_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/retention"
)

// Environment of a child pruner.
const (
	envSchema = "LLMQ_TEST_SCHEMA"
	envID     = "LLMQ_TEST_PRUNER_ID"
)

// runChildPruner is a pruning process: it runs a retention service until
// it is killed, logging each batch's time span (inside the batch's
// transaction, so the log commits with the batch) to batch_log.
func runChildPruner() int {
	ctx := context.Background()
	schema, id := os.Getenv(envSchema), os.Getenv(envID)
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child pruner:", err)
		return 1
	}
	defer pool.Close()
	svc, err := retention.New(pool, retention.Config{Schema: schema, ID: id, Interval: 20 * time.Millisecond, Lease: 300 * time.Millisecond, BatchSize: 25})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child pruner:", err)
		return 1
	}
	retention.SetBeforeCommit(svc, func(tx pgx.Tx) {
		var t0 time.Time
		if err := tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t0); err != nil {
			panic(err)
		}
		time.Sleep(3 * time.Millisecond) // widens the window a second pruner would need; not synchronisation
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".batch_log (holder, t0, t1) VALUES ($1, $2, clock_timestamp())", id, t0); err != nil {
			panic(err)
		}
	})
	if err := svc.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child pruner:", err)
		return 1
	}
	return 0
}

// Three pruning processes on one schema: no two batches ever overlap in
// time, the first holder killed mid-run is replaced by another, and
// together they delete exactly what was due.
func TestProcessesNeverPruneAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.finishedBacklog(t, 2000)
	keep := f.enqueue(t, "waiting")
	f.exec(t, `CREATE TABLE %s.batch_log (holder text NOT NULL, t0 timestamptz NOT NULL, t1 timestamptz NOT NULL)`)

	children := map[string]*exec.Cmd{}
	for i := range 3 {
		id := fmt.Sprint("pruner-", i)
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=pruner", envSchema+"="+f.db.Schema, envID+"="+id)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		children[id] = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}

	// Kill whichever process holds the lease once it has pruned a while.
	var first string
	require.Eventually(t, func() bool {
		err := f.db.Pool.QueryRow(t.Context(), "SELECT holder FROM "+f.db.Schema+".batch_log GROUP BY holder HAVING count(*) >= 10 LIMIT 1").Scan(&first)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, children[first].Process.Signal(syscall.SIGKILL))

	require.Eventually(t, func() bool { return f.count(t, "jobs") == 1 }, 60*time.Second, 20*time.Millisecond)
	require.True(t, f.exists(t, keep.ID))
	require.Equal(t, 1, f.count(t, "job_keys"))
	require.Zero(t, f.count(t, "job_attempts"))

	var overlaps, holders int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), fmt.Sprintf(`
		SELECT (SELECT count(*) FROM %[1]s.batch_log a JOIN %[1]s.batch_log b
		            ON (a.holder, a.t0) <> (b.holder, b.t0) AND a.t0 < b.t1 AND b.t0 < a.t1),
		       (SELECT count(DISTINCT holder) FROM %[1]s.batch_log)`, f.db.Schema)).Scan(&overlaps, &holders))
	require.Zero(t, overlaps, "two batches ran at once")
	require.GreaterOrEqual(t, holders, 2, "another process took over from the killed one")
}
