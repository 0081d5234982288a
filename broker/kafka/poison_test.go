package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

// poisonFixture ingests one topic through package inbox, recording each
// handled message in a table whose primary key refuses a second commit.
type poisonFixture struct {
	*cluster
	db           *dbtest.DB
	store        *inbox.Store
	topic, group string
	mu           sync.Mutex
	calls        map[string]int
}

// setupPoison makes a topic of one partition, so that its records are
// handled, and quarantined, in offset order.
func setupPoison(t *testing.T, c *cluster) *poisonFixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 4})
	store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = db.Pool.Exec(t.Context(), "CREATE TABLE "+db.Schema+".received (message_id text PRIMARY KEY)")
	require.NoError(t, err)
	return &poisonFixture{cluster: c, db: db, store: store, topic: c.topic(t, "poison", 1), group: c.group("poison"), calls: map[string]int{}}
}

// handler refuses "not json" as malformed, fails "stuck" forever with an
// error the ingress cannot classify, and records everything else.
func (f *poisonFixture) handler(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
	f.mu.Lock()
	f.calls[msg.ID]++
	f.mu.Unlock()
	switch {
	case string(msg.Body) == "not json":
		return inbox.Malformed(errors.New("the body is not JSON"))
	case msg.ID == "stuck":
		return errors.New("the ERP refuses this one, every time")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+f.db.Schema+".received (message_id) VALUES ($1)", msg.ID)
	return err
}

// produce writes records to the topic's partition 0 as a foreign client
// does, in order.
func (f *poisonFixture) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...), kgo.DefaultProduceTopic(f.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(t.Context(), recs...).FirstErr())
}

// run ingests until the group's commit reaches the topic's end and
// wantReceived messages are recorded, then stops.
func (f *poisonFixture) run(t *testing.T, cfg kafka.ConsumerConfig, maxAttempts, wantReceived int) {
	t.Helper()
	cfg.Group, cfg.Topics = f.group, []string{f.topic}
	cfg.MaxInFlight, cfg.CommitInterval, cfg.NackDelay = 4, 20*time.Millisecond, 10*time.Millisecond
	k := f.consumer(t, cfg)
	in, err := f.store.NewIngress(f.db.Pool, k, inbox.IngressConfig{Consumer: "ingest", Handler: f.handler, MaxAttempts: maxAttempts})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	ends := f.ends(t, f.topic)
	require.Eventually(t, func() bool {
		got, err := f.committed(t.Context(), f.group, f.topic)
		return err == nil && fmt.Sprint(got) == fmt.Sprint(ends) && f.received(t) == wantReceived
	}, 60*time.Second, 20*time.Millisecond, "the commit reaches the end, %v, with %d messages received", ends, wantReceived)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, k.Close())
}

func (f *poisonFixture) received(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".received").Scan(&n))
	return n
}

// deadLetters reads the dead-letter topic from its start to its end.
func (f *poisonFixture) deadLetters(t *testing.T) []*kgo.Record {
	t.Helper()
	want := f.ends(t, f.topic+".dlq")[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...), kgo.ConsumeTopics(f.topic+".dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for int64(len(out)) < want {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		out = append(out, fetches.Records()...)
	}
	return out
}

func idHeader(id string) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: kafka.HeaderMessageID, Value: []byte(id)}}
}

// A poison record of each kind a foreign producer can write, then 1,000
// good records, on one partition with MaxInFlight 4: every good record is
// accepted once, the commit reaches the partition's end, and each poison
// is quarantined once, as received, and in the dead-letter topic once,
// byte for byte.
func TestPoisonRecordsDoNotStopThePartition(t *testing.T) {
	t.Parallel()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			f := setupPoison(t, tg.setup(t))
			poisons := []*kgo.Record{
				{Value: nil}, // a tombstone without an id
				{Value: nil, Headers: idHeader("tomb-1")},
				{Value: []byte(`{}`), Headers: idHeader("evt-\x07")},
				{Value: []byte{}, Headers: idHeader("evt-\xff\xfe")},
				{Value: []byte(`{}`), Headers: idHeader(strings.Repeat("x", 300))},
				{Value: []byte(`{}`), Headers: append(idHeader("hdr-1"), kgo.RecordHeader{Key: "traceparent", Value: []byte("\xc3\x28")})},
				{Value: []byte("not json"), Headers: idHeader("bad-json")},
			}
			recs := append([]*kgo.Record{}, poisons...)
			const good = 1000
			for i := range good {
				recs = append(recs, &kgo.Record{Key: []byte("k"), Value: []byte(`{}`), Headers: idHeader(fmt.Sprintf("good-%04d", i))})
			}
			f.produce(t, recs...)
			f.run(t, kafka.ConsumerConfig{}, 0, good)

			f.mu.Lock()
			for i := range good {
				require.LessOrEqual(t, f.calls[fmt.Sprintf("good-%04d", i)], 2, "handled at most twice (a whole batch that rolled back, then committed)")
			}
			for _, p := range poisons[1:6] {
				require.Zero(t, f.calls[string(p.Headers[0].Value)], "the handler never saw %q", p.Headers)
			}
			require.Zero(t, f.calls[""], "the handler never saw a message without an id")
			f.mu.Unlock()
			var accepted int
			require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".inbox").Scan(&accepted))
			require.Equal(t, good, accepted, "every good record accepted once")

			q, err := f.store.ListQuarantined(t.Context(), f.db.Pool, "ingest", 100)
			require.NoError(t, err)
			require.Len(t, q, len(poisons), "each poison quarantined once")
			for i, p := range poisons {
				row := q[i] // one partition: quarantined in offset order
				require.Equal(t, broker.Source{Topic: f.topic, Offset: int64(i)}, row.Source)
				wantID := ""
				if len(p.Headers) > 0 {
					wantID = string(p.Headers[0].Value)
				}
				require.Equal(t, wantID, row.MessageID, "the id's bytes")
				require.Equal(t, p.Value == nil, row.Payload == nil, "a null value stays null, an empty one empty")
				require.Equal(t, string(p.Value), string(row.Payload))
				for _, h := range p.Headers {
					require.Equal(t, string(h.Value), row.Headers[h.Key], "header bytes kept")
				}
			}

			dead := f.deadLetters(t)
			require.Len(t, dead, len(poisons), "each poison dead-lettered once")
			for i, r := range dead {
				p := poisons[i]
				require.Equal(t, p.Value == nil, r.Value == nil, "the dead letter is the original: a tombstone stays one")
				require.Equal(t, string(p.Value), string(r.Value))
				require.Len(t, r.Headers, len(p.Headers)+2, "the original headers and the two dead-letter headers")
				for j, h := range p.Headers {
					require.Equal(t, h.Key, r.Headers[j].Key)
					require.Equal(t, string(h.Value), string(r.Headers[j].Value))
				}
				require.Equal(t, kafka.HeaderDeadLetterReason, r.Headers[len(p.Headers)].Key)
				require.Equal(t, fmt.Sprintf("%s/0/%d", f.topic, i), string(r.Headers[len(p.Headers)+1].Value))
			}
		})
	}
}

// A handler that fails one record forever: it is quarantined and rejected
// at its MaxAttempts-th failure, and the partition moves on to the end.
func TestFailureCapMovesThePartitionOn(t *testing.T) {
	t.Parallel()
	f := setupPoison(t, setup(t, ""))
	recs := []*kgo.Record{{Value: []byte(`{}`), Headers: idHeader("stuck")}}
	for i := range 100 {
		recs = append(recs, &kgo.Record{Value: []byte(`{}`), Headers: idHeader(fmt.Sprintf("good-%03d", i))})
	}
	f.produce(t, recs...)
	f.run(t, kafka.ConsumerConfig{}, 3, 100)

	f.mu.Lock()
	require.GreaterOrEqual(t, f.calls["stuck"], 3)
	f.mu.Unlock()
	q, err := f.store.ListQuarantined(t.Context(), f.db.Pool, "ingest", 10)
	require.NoError(t, err)
	require.Len(t, q, 1)
	require.Equal(t, "stuck", q[0].MessageID)
	require.Contains(t, q[0].Reason, inbox.ErrTooManyAttempts.Error())
	require.Contains(t, q[0].Reason, "3 failures, the last: the ERP refuses this one")
	dead := f.deadLetters(t)
	require.Len(t, dead, 1)
	require.Equal(t, idHeader("stuck"), dead[0].Headers[:1])
}

// A producer's aborted transaction is never accepted; the committed
// records around it are. ReadUncommitted opts out, and then it is.
func TestAbortedTransactionsAreNeverAccepted(t *testing.T) {
	t.Parallel()
	for _, readUncommitted := range []bool{false, true} {
		t.Run(fmt.Sprintf("ReadUncommitted %t", readUncommitted), func(t *testing.T) {
			t.Parallel()
			f := setupPoison(t, setup(t, ""))
			txn, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...), kgo.DefaultProduceTopic(f.topic), kgo.TransactionalID("llmq-test-"+suffix()))
			require.NoError(t, err)
			defer txn.Close()
			inTxn := func(commit kgo.TransactionEndTry, prefix string) {
				require.NoError(t, txn.BeginTransaction())
				for i := range 5 {
					txn.Produce(t.Context(), &kgo.Record{Value: []byte(`{}`), Headers: idHeader(fmt.Sprintf("%s-%d", prefix, i))}, nil)
				}
				require.NoError(t, txn.Flush(t.Context()))
				require.NoError(t, txn.EndTransaction(t.Context(), commit))
			}
			inTxn(kgo.TryCommit, "committed")
			inTxn(kgo.TryAbort, "aborted")
			inTxn(kgo.TryCommit, "later")
			plain := make([]*kgo.Record, 5)
			for i := range plain {
				plain[i] = &kgo.Record{Value: []byte(`{}`), Headers: idHeader(fmt.Sprintf("plain-%d", i))}
			}
			f.produce(t, plain...)

			want := 15
			if readUncommitted {
				want = 20
			}
			f.run(t, kafka.ConsumerConfig{ReadUncommitted: readUncommitted}, 0, want)
			rows, err := f.db.Pool.Query(t.Context(), "SELECT message_id FROM "+f.db.Schema+".received WHERE message_id LIKE 'aborted-%'")
			require.NoError(t, err)
			aborted, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			if readUncommitted {
				require.Len(t, aborted, 5, "read_uncommitted delivers the aborted records")
			} else {
				require.Empty(t, aborted, "no record of the aborted transaction was accepted")
			}
		})
	}
}
