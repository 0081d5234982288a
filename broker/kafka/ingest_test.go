package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
)

// watched counts what a consumer delivers.
type watched struct {
	broker.Consumer
	seen       *sync.Map // message id -> *atomic.Int32, shared by the group
	deliveries atomic.Int64
}

func (w *watched) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := w.Consumer.Receive(ctx)
	if err == nil {
		w.deliveries.Add(1)
		n, _ := w.seen.LoadOrStore(d.Message().ID, new(atomic.Int32))
		n.(*atomic.Int32).Add(1) //nolint:errcheck,forcetypeassert // only *atomic.Int32 is stored
	}
	return d, err
}

// ingestFixture ingests a topic through package inbox into its own schema.
type ingestFixture struct {
	*cluster
	db           *dbtest.DB
	store        *inbox.Store
	topic, group string
	seen         sync.Map
	mu           sync.Mutex
	handled      map[string]int // handler calls by message id
}

// durable reads what the inbox holds: the partitions and offsets of the
// accepted records.
func (f *ingestFixture) durable(ctx context.Context) (map[int32]map[int64]bool, int, error) {
	rows, err := f.db.Pool.Query(ctx, "SELECT coalesce((source->>'partition')::int, 0), coalesce((source->>'offset')::bigint, 0) FROM "+f.db.Schema+".inbox WHERE consumer = 'ingest'")
	if err != nil {
		return nil, 0, err
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (broker.Source, error) {
		var src broker.Source
		return src, row.Scan(&src.Partition, &src.Offset)
	})
	if err != nil {
		return nil, 0, err
	}
	out := map[int32]map[int64]bool{}
	for _, src := range recs {
		if out[src.Partition] == nil {
			out[src.Partition] = map[int64]bool{}
		}
		out[src.Partition][src.Offset] = true
	}
	return out, len(recs), nil
}

// observe checks, until ctx ends, that no committed offset passes a record
// the inbox does not hold. The offsets are read first: whatever they cover
// was durable before they were committed. It returns the violations and
// how many observations saw a commit.
func (f *ingestFixture) observe(ctx context.Context) (violations []string, observed int) {
	for ctx.Err() == nil {
		committed, err := f.committed(ctx, f.group, f.topic)
		if err != nil {
			continue // the group is being created or rebalanced
		}
		durable, _, err := f.durable(ctx)
		if err != nil {
			continue
		}
		for p, upTo := range committed {
			if upTo > 0 {
				observed++
			}
			for o := range upTo {
				if !durable[p][o] {
					violations = append(violations, fmt.Sprintf("partition %d committed to %d, but offset %d is not in the inbox", p, upTo, o))
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return violations, observed
}

func (f *ingestFixture) handler(ctx context.Context, _ pgx.Tx, msg broker.Message) error {
	f.mu.Lock()
	f.handled[msg.ID]++
	f.mu.Unlock()
	select { // a random amount of work, so receivers settle out of order
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(rand.IntN(3000)) * time.Microsecond):
	}
	return nil
}

// ingest runs an Ingress of loops concurrent batches on consumer; the
// returned stop ends it.
func (f *ingestFixture) ingest(t *testing.T, c broker.Consumer, loops int) (stop func()) {
	t.Helper()
	in, err := f.store.NewIngress(f.db.Pool, c, inbox.IngressConfig{Consumer: "ingest", Handler: f.handler, Concurrency: loops})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = in.Run(ctx) })
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

func (f *ingestFixture) consumer(t *testing.T) (*kafka.Consumer, *watched) {
	t.Helper()
	k := f.cluster.consumer(t, kafka.ConsumerConfig{Group: f.group, Topics: []string{f.topic}, MaxInFlight: 16, CommitInterval: 50 * time.Millisecond})
	return k, &watched{Consumer: k, seen: &f.seen}
}

// Three partitions, ingested through the inbox by a group whose receivers
// take random time and settle out of order, while a third consumer joins
// and the first leaves: committed offsets never pass a record the inbox
// does not hold, nothing is lost, and the redelivered record the first
// consumer had accepted but not acked is a duplicate the handler never
// sees.
func TestIngestCommitsOnlyDurableRecordsAcrossRebalances(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			c := tg.setup(t)
			db := dbtest.Setup(t, dbtest.Options{MaxConns: 20})
			store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
			require.NoError(t, err)
			f := &ingestFixture{cluster: c, db: db, store: store, handled: map[string]int{}}
			f.topic, f.group = c.topic(t, "ingest", 3), c.group("ingest")
			const n = 2400
			f.publish(t, f.topic, n, 30)

			obsCtx, stopObserving := context.WithCancel(t.Context())
			var violations []string
			var observed int
			observing := make(chan struct{})
			go func() { defer close(observing); violations, observed = f.observe(obsCtx) }()

			// The first consumer accepts one record in the inbox and
			// never acks it, as if it stopped between commit and ack.
			k1, w1 := f.consumer(t)
			held := receive(t, k1)
			require.NoError(t, pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
				_, err := store.Accept(t.Context(), tx, "ingest", held.Message(), held.Source())
				return err
			}))
			stop1 := f.ingest(t, w1, 4)
			_, w2 := f.consumer(t)
			f.ingest(t, w2, 4)

			accepted := func(atLeast int) func() bool {
				return func() bool {
					_, got, err := f.durable(t.Context())
					return err == nil && got >= atLeast
				}
			}
			require.Eventually(t, accepted(n/3), 60*time.Second, 10*time.Millisecond)
			_, w3 := f.consumer(t)
			f.ingest(t, w3, 4)
			require.Eventually(t, func() bool { return w3.deliveries.Load() > 0 }, 30*time.Second, 10*time.Millisecond, "the joining consumer gets partitions")
			require.Eventually(t, accepted(2*n/3), 60*time.Second, 10*time.Millisecond)
			stop1()
			require.NoError(t, k1.Close())
			require.Error(t, held.Ack(t.Context()), "the held record's consumer is gone")

			require.Eventually(t, accepted(n), 60*time.Second, 10*time.Millisecond)
			ends := f.ends(t, f.topic)
			require.Eventually(t, func() bool {
				got, err := f.committed(t.Context(), f.group, f.topic)
				return err == nil && fmt.Sprint(got) == fmt.Sprint(ends)
			}, 30*time.Second, 10*time.Millisecond, "every partition is committed to its end")
			stopObserving()
			<-observing

			require.Empty(t, violations)
			require.Positive(t, observed)
			f.mu.Lock()
			defer f.mu.Unlock()
			require.Len(t, f.handled, n-1, "every record but the held one reached the handler")
			for id, calls := range f.handled {
				require.Equal(t, 1, calls, "handler calls for %s", id)
			}
			require.NotContains(t, f.handled, held.Message().ID)
			again, ok := f.seen.Load(held.Message().ID)
			require.True(t, ok, "the held record is delivered again")
			require.Positive(t, again.(*atomic.Int32).Load()) //nolint:errcheck,forcetypeassert // only *atomic.Int32 is stored
			// The first consumer gave partitions up when the second joined,
			// and the rest when it left.
			require.GreaterOrEqual(t, k1.Stats().Revocations, int64(2))
		})
	}
}

// A record from a producer that sets no id header arrives with an empty
// ID: the ingress quarantines it, with its Kafka source, and rejects it to
// the dead-letter topic; the partition's commit moves past it.
func TestIngressDeadLettersARecordWithoutID(t *testing.T) {
	t.Parallel()
	c := setup(t, "")
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 4})
	store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	topic, group := c.topic(t, "foreign", 1), c.group("foreign")
	foreign, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	require.NoError(t, err)
	defer foreign.Close()
	require.NoError(t, foreign.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Value: []byte(`{"total":"1.00"}`)}).FirstErr())

	k := c.consumer(t, kafka.ConsumerConfig{Group: group, Topics: []string{topic}, CommitInterval: time.Hour})
	in, err := store.NewIngress(db.Pool, k, inbox.IngressConfig{Consumer: "ingest", Handler: func(context.Context, pgx.Tx, broker.Message) error {
		t.Error("the handler must not see a message without an id")
		return nil
	}})
	require.NoError(t, err)
	require.ErrorIs(t, in.Handle(t.Context(), receive(t, k)), inbox.ErrMalformed)

	q, err := store.ListQuarantined(t.Context(), db.Pool, "ingest", 10)
	require.NoError(t, err)
	require.Len(t, q, 1)
	require.Equal(t, broker.Source{Topic: topic}, q[0].Source)
	require.Equal(t, map[int32]int64{0: 1}, c.ends(t, topic+".dlq"))
	require.NoError(t, k.Commit(t.Context()))
	got, err := c.committed(t.Context(), group, topic)
	require.NoError(t, err)
	require.Equal(t, int64(1), got[0])
}
