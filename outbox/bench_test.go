package outbox_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/outbox"
)

// BenchmarkEventWAL measures, in bytes of WAL per event (all of the
// server's, full-page images included), what an event costs in each part
// of its life: its write (100 events per transaction, each of its own key
// and aggregate, shaped like the job store's events); its relaying (claim,
// publication to the memory broker, verdict, and the vacuum of the row
// versions that left), moments after the write as in steady state; and
// its pruning (with its vacuum), after a checkpoint, as a day later.
// relayed-events/s times the relay's Drain alone (one relay, BatchSize 500).
// "keep" marks events published and prunes them after the retention;
// "delete" is RelayConfig.DeletePublished, which leaves nothing to prune.
// "batch-" writes each transaction's 100 events with one
// Store.WriteBatch, one batch row, instead of 100 Store.Write calls.
// Run it on a server nothing else writes to:
//
//	go test -run '^$' -bench EventWAL -benchtime 20000x ./outbox/
func BenchmarkEventWAL(b *testing.B) {
	b.Run("keep", func(b *testing.B) { benchEventWAL(b, false, false) })
	b.Run("delete", func(b *testing.B) { benchEventWAL(b, true, false) })
	b.Run("batch-keep", func(b *testing.B) { benchEventWAL(b, false, true) })
	b.Run("batch-delete", func(b *testing.B) { benchEventWAL(b, true, true) })
}

// benchEventWAL is one run of BenchmarkEventWAL.
func benchEventWAL(b *testing.B, deletePublished, batched bool) {
	b.Helper()
	n := b.N
	db := dbtest.Setup(b)
	store, err := outbox.NewStore(outbox.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	exec := func(sql string) {
		b.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()

	exec("CHECKPOINT")
	start := walLSN(b, db.Pool)
	for done := 0; done < n; done += 100 {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			events := make([]outbox.Event, min(100, n-done))
			for i := range events {
				job := uuid.New()
				payload := fmt.Sprintf(`{"job_id":%q,"tenant":"tenant-1","kind":"bench.noop","queue":"default","state":"SUCCEEDED","state_version":3,"attempt":1}`, job)
				events[i] = outbox.Event{AggregateID: job, Topic: "llmq.jobs", Key: job.String(),
					Type: "bench.noop.completed", Payload: json.RawMessage(payload)}
			}
			if batched {
				_, err := store.WriteBatch(ctx, tx, events)
				return err
			}
			for _, ev := range events {
				if _, err := store.Write(ctx, tx, ev); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	written := walLSN(b, db.Pool) - start

	// No checkpoint here: a relay publishes events moments after their
	// write, within the same checkpoint cycle, so it writes no full-page
	// image of the pages the write touched.
	start = walLSN(b, db.Pool)
	broker := memory.New(memory.Config{})
	relay, err := store.NewRelay(db.Pool, broker.Publisher(), outbox.RelayConfig{BatchSize: 500, DeletePublished: deletePublished})
	if err != nil {
		b.Fatal(err)
	}
	drainStart := time.Now()
	res, err := relay.Drain(ctx)
	drained := time.Since(drainStart)
	if err != nil {
		b.Fatal(err)
	}
	if res.Published != n {
		b.Fatalf("published %d of %d events", res.Published, n)
	}
	// What the relay left for vacuum (the row versions its claims and
	// publications replaced) is its cost too.
	exec("VACUUM " + db.Schema + ".outbox, " + db.Schema + ".outbox_batches")
	relayed := walLSN(b, db.Pool) - start
	b.ReportMetric(float64(written)/float64(n), "write-wal-B/event")
	b.ReportMetric(float64(relayed)/float64(n), "relay-wal-B/event")
	b.ReportMetric(float64(n)/drained.Seconds(), "relayed-events/s")
	if deletePublished {
		var left int
		if err := db.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+db.Schema+".outbox) + (SELECT count(*) FROM "+db.Schema+".outbox_batches)").Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left != 0 {
			b.Fatalf("%d published events were kept", left)
		}
		return
	}

	// As if the retention had passed: the events are moved back in time,
	// outside the measured phase.
	exec("UPDATE " + db.Schema + ".outbox SET published_at = now() - interval '2 days'")
	exec("UPDATE " + db.Schema + ".outbox_batches SET published_at = now() - interval '2 days'")
	exec("VACUUM " + db.Schema + ".outbox, " + db.Schema + ".outbox_batches")
	exec("CHECKPOINT")
	start = walLSN(b, db.Pool)
	pruner, err := outbox.NewPruner(db.Schema)
	if err != nil {
		b.Fatal(err)
	}
	for pruned := int64(0); pruned < int64(n); {
		res, err := pruner.PrunePublished(ctx, db.Pool, time.Hour, outbox.MaxPruneBatch)
		if err != nil {
			b.Fatal(err)
		}
		deleted := res.Events
		if deleted == 0 {
			b.Fatalf("pruned %d of %d events", pruned, n)
		}
		pruned += deleted
	}
	exec("VACUUM " + db.Schema + ".outbox, " + db.Schema + ".outbox_batches")
	pruned := walLSN(b, db.Pool) - start
	b.StopTimer()
	b.ReportMetric(float64(pruned)/float64(n), "prune-wal-B/event")
}

func walLSN(b *testing.B, pool *pgxpool.Pool) int64 {
	b.Helper()
	var lsn int64
	if err := pool.QueryRow(b.Context(), "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}
