package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
)

// A change-data-capture topic: change events with tombstones between them,
// one without an id as Debezium writes them, one with an id, and that one
// again (a producer's retry). Each policy of inbox.IngressConfig.Tombstones
// does what it says, and the partition's commit reaches its end in each.
func TestTombstonePolicies(t *testing.T) {
	t.Parallel()
	// A function: the client fills in the records it produces.
	recs := func() []*kgo.Record {
		return []*kgo.Record{
			{Key: []byte("row-1"), Value: []byte(`{"op":"c"}`), Headers: idHeader("change-0")},
			{Key: []byte("row-1"), Value: []byte(`{"op":"d"}`), Headers: idHeader("change-1")},
			{Key: []byte("row-1"), Value: nil}, // a tombstone without an id
			{Key: []byte("row-2"), Value: nil, Headers: idHeader("delete-2")},
			{Key: []byte("row-3"), Value: []byte(`{"op":"c"}`), Headers: idHeader("change-2")},
			{Key: []byte("row-2"), Value: nil, Headers: idHeader("delete-2")}, // the same tombstone again
			{Key: []byte("row-3"), Value: []byte(`{"op":"u"}`), Headers: idHeader("change-3")},
		}
	}
	changes := []string{"change-0", "change-1", "change-2", "change-3"}
	for _, tc := range []struct {
		policy      inbox.TombstonePolicy
		handled     []string // ids handled with a nil Body, once each
		quarantined []int64  // offsets quarantined and dead-lettered
		skipped     int64
	}{
		{policy: inbox.QuarantineTombstones, quarantined: []int64{2, 3, 5}},
		{policy: inbox.SkipTombstones, skipped: 3},
		{policy: inbox.HandleTombstones, handled: []string{"delete-2"}, quarantined: []int64{2}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			f := setupPoison(t, setup(t, ""))
			f.produce(t, recs()...)
			var (
				mu        sync.Mutex
				calls     = map[string]int{}
				nilBodies = map[string]bool{}
			)
			handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
				mu.Lock()
				calls[msg.ID]++
				nilBodies[msg.ID] = msg.Body == nil
				mu.Unlock()
				_, err := tx.Exec(ctx, "INSERT INTO "+f.db.Schema+".received (message_id) VALUES ($1)", msg.ID)
				return err
			}
			m := telemetrytest.NewMetrics(t)
			k := f.consumer(t, kafka.ConsumerConfig{Group: f.group, Topics: []string{f.topic},
				MaxInFlight: 4, CommitInterval: 20 * time.Millisecond, NackDelay: 10 * time.Millisecond})
			in, err := f.store.NewIngress(f.db.Pool, k, inbox.IngressConfig{Consumer: "cdc", Handler: handler,
				Tombstones: tc.policy, MeterProvider: m.Provider, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- in.Run(ctx) }()
			want := len(changes) + len(tc.handled)
			ends := f.ends(t, f.topic)
			require.Eventually(t, func() bool {
				got, err := f.committed(t.Context(), f.group, f.topic)
				return err == nil && fmt.Sprint(got) == fmt.Sprint(ends) && f.received(t) == want
			}, 60*time.Second, 20*time.Millisecond, "the commit reaches the end, %v, with %d messages received", ends, want)
			cancel()
			require.NoError(t, <-done)
			require.NoError(t, k.Close())

			mu.Lock()
			for _, id := range changes {
				require.False(t, nilBodies[id], "%s has its body", id)
			}
			for _, id := range tc.handled {
				require.True(t, nilBodies[id], "%s reached the handler with a nil Body", id)
				require.Equal(t, 1, calls[id], "%s handled once: its second copy is a duplicate", id)
			}
			require.Zero(t, calls[""], "the handler never saw a message without an id")
			if len(tc.handled) == 0 {
				require.Len(t, calls, len(changes), "the handler saw no tombstone")
			}
			mu.Unlock()

			var recorded int
			require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".inbox").Scan(&recorded))
			require.Equal(t, want, recorded, "the changes recorded, and the tombstones the handler took")
			q, err := f.store.ListQuarantined(t.Context(), f.db.Pool, "cdc", 10)
			require.NoError(t, err)
			require.Len(t, q, len(tc.quarantined))
			for i, off := range tc.quarantined {
				require.Equal(t, off, q[i].Source.Offset)
				require.Nil(t, q[i].Payload, "a null body kept null")
			}
			if len(tc.quarantined) > 0 {
				dead := f.deadLetters(t)
				require.Len(t, dead, len(tc.quarantined))
				for _, r := range dead {
					require.Nil(t, r.Value, "the tombstone dead-lettered as it was")
				}
			} else {
				require.Zero(t, f.ends(t, f.topic+".dlq")[0], "nothing dead-lettered")
			}
			skipped, _ := m.Collect(t).Int("llmq.inbox.messages", attribute.String("consumer", "cdc"), attribute.String("result", "skipped"))
			require.Equal(t, tc.skipped, skipped)
		})
	}
}
