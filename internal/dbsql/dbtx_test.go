package dbsql_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbtest"
)

// fn fails because its context ended after one of its writes: the write is
// rolled back with its savepoint, so committing the enclosing transaction
// commits none of it.
func TestWithTxRollsBackASavepointWhoseContextEnded(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	_, err := db.Pool.Exec(t.Context(), "CREATE SCHEMA "+db.Schema+"; CREATE TABLE "+db.Schema+".writes (step text)")
	require.NoError(t, err)
	outer, err := db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = outer.Rollback(context.Background()) }()

	ctx, cancel := context.WithCancel(t.Context())
	err = dbsql.WithTx(ctx, outer, func(sp pgx.Tx) error {
		if _, err := sp.Exec(ctx, "INSERT INTO "+db.Schema+".writes VALUES ('first')"); err != nil {
			return err
		}
		cancel()
		_, err := sp.Exec(ctx, "INSERT INTO "+db.Schema+".writes VALUES ('second')")
		return err
	})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, dbsql.ErrSavepointLeftOpen, "the savepoint was rolled back")
	require.NoError(t, outer.Commit(t.Context()))
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+db.Schema+".writes").Scan(&n))
	require.Zero(t, n, "the savepoint's first write committed")
}

// A savepoint whose work takes longer than the bound on ending it (5s)
// is still released: the bound starts when the work is done. (It started
// with WithTx, and an EnqueueBatch of 10,000 jobs on a loaded machine
// failed to release its savepoint.)
func TestWithTxReleasesASavepointAfterLongWork(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	outer, err := db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = outer.Rollback(context.Background()) }()
	err = dbsql.WithTx(t.Context(), outer, func(sp pgx.Tx) error {
		_, err := sp.Exec(t.Context(), "SELECT pg_sleep(5.5)")
		return err
	})
	require.NoError(t, err)
	require.NoError(t, outer.Commit(t.Context()))
}

const (
	planSet     = "SELECT set_config('llmq.enable_seqscan', current_setting('enable_seqscan'), true), set_config('enable_seqscan', 'off', true)"
	planRestore = "SELECT set_config('enable_seqscan', current_setting('llmq.enable_seqscan'), true)"
	planSeen    = "SELECT current_setting('enable_seqscan')"
)

// seen runs planSeen through CollectUnder on db and returns what it read.
func seen(t *testing.T, db dbsql.DBTX) string {
	t.Helper()
	got, err := dbsql.CollectUnder(t.Context(), db, planSet, planRestore, planSeen, nil, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, got, 1)
	return got[0]
}

// The statement runs under the settings, on a connection of its own, and
// the settings end with it.
func TestCollectUnderAppliesTheSettingsToItsStatementOnly(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	conn, err := db.Pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	require.Equal(t, "off", seen(t, conn.Conn()))
	var after string
	require.NoError(t, conn.QueryRow(t.Context(), planSeen).Scan(&after))
	require.Equal(t, "on", after, "the setting outlived its statement")
}

// In a caller's transaction the setting in force before is put back, for
// the rest of that transaction, whatever it was.
func TestCollectUnderRestoresTheCallersSettings(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	for _, before := range []string{"on", "off"} {
		tx, err := db.Pool.Begin(t.Context())
		require.NoError(t, err)
		_, err = tx.Exec(t.Context(), "SELECT set_config('enable_seqscan', $1, true)", before)
		require.NoError(t, err)
		require.Equal(t, "off", seen(t, tx))
		var after string
		require.NoError(t, tx.QueryRow(t.Context(), planSeen).Scan(&after))
		require.Equal(t, before, after, "the caller's transaction kept the statement's setting")
		require.NoError(t, tx.Rollback(t.Context()))
	}
}

// An error of the settings, of the statement or of the batch's end reaches
// the caller, and the connection goes back to its pool usable.
func TestCollectUnderReportsEveryStatementsError(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true, MaxConns: 1})
	_, err := dbsql.CollectUnder(t.Context(), db.Pool, "SELECT no_such_function()", planRestore, planSeen, nil, pgx.RowTo[string])
	require.ErrorContains(t, err, "no_such_function")
	_, err = dbsql.CollectUnder(t.Context(), db.Pool, planSet, planRestore, "SELECT 1/0", nil, pgx.RowTo[int])
	require.ErrorContains(t, err, "division by zero")
	tx, err := db.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	// Fails as it runs, after the statement's rows were read.
	_, err = dbsql.CollectUnder(t.Context(), tx, planSet, "SELECT current_setting('llmq.no_such_setting')", planSeen, nil, pgx.RowTo[string])
	require.ErrorContains(t, err, "llmq.no_such_setting", "the restore's failure is the caller's to see")
	require.NoError(t, tx.Rollback(t.Context()))
	require.Equal(t, "off", seen(t, db.Pool), "the pool's one connection is usable again")
}

// RawJSON scans a jsonb value, its JSON null and SQL NULL as scanning into
// a *json.RawMessage would, each into a copy of its own that later rows do
// not overwrite.
func TestRawJSONScansAsRawMessage(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{Unmigrated: true})
	values := []*string{new(`{"text": "lorem", "n": [1, 2.5, null]}`), nil, new("null"), new(`"\u00e9"`), new(`{"text": "ipsum"}`)}
	rows, err := db.Pool.Query(t.Context(), "SELECT v, v FROM unnest($1::jsonb[]) WITH ORDINALITY AS u (v, i) ORDER BY i", values)
	require.NoError(t, err)
	var viaUnmarshal, viaRaw []json.RawMessage
	for rows.Next() {
		var u, r json.RawMessage
		require.NoError(t, rows.Scan(&u, dbsql.RawJSON(&r)))
		viaUnmarshal, viaRaw = append(viaUnmarshal, u), append(viaRaw, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, viaUnmarshal, viaRaw)
	require.Len(t, viaRaw, len(values))
	for i, v := range values {
		require.Equal(t, v == nil, viaRaw[i] == nil, i)
	}
	require.JSONEq(t, `{"text": "lorem", "n": [1, 2.5, null]}`, string(viaRaw[0]), "the first row's value outlives the rows after it")
}

// BenchmarkScanJSONB scans 1,000 jsonb values of about 100 bytes and about
// 4 KB, into a *json.RawMessage and through RawJSON.
func BenchmarkScanJSONB(b *testing.B) {
	db := dbtest.Setup(b, dbtest.Options{Unmigrated: true})
	for _, size := range []int{100, 4000} {
		for _, via := range []string{"RawMessage", "RawJSON"} {
			b.Run(fmt.Sprintf("%s/%dB", via, size), func(b *testing.B) {
				for b.Loop() {
					rows, err := db.Pool.Query(b.Context(),
						"SELECT jsonb_build_object('text', repeat('lorem ipsum ', $1::int / 12), 'n', g) FROM generate_series(1, 1000) AS g", size)
					require.NoError(b, err)
					for rows.Next() {
						var v json.RawMessage
						dest := any(&v)
						if via == "RawJSON" {
							dest = dbsql.RawJSON(&v)
						}
						require.NoError(b, rows.Scan(dest))
					}
					require.NoError(b, rows.Err())
				}
			})
		}
	}
}
