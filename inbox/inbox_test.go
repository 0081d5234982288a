package inbox_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
)

type fixture struct {
	store  *inbox.Store
	pool   *pgxpool.Pool
	schema string
}

func setup(t *testing.T, conns int32) *fixture {
	t.Helper()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: conns})
	store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	return &fixture{store: store, pool: db.Pool, schema: db.Schema}
}

// accepted counts the inbox's rows.
func (f *fixture) accepted(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.schema+".inbox").Scan(&n))
	return n
}

var (
	order42 = broker.Message{ID: "evt-42", Topic: "orders", Body: []byte(`{"order":42}`)}
	queue   = broker.Source{Queue: "erp"}
)

// Twenty deliveries of one message race, each in its own transaction: one
// is NewMessage, every other is a Duplicate, and one row exists.
func TestConcurrentDuplicatesAcceptOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, 20)
	const deliveries = 20
	results := make([]inbox.Result, deliveries)
	errs := make([]error, deliveries)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range deliveries {
		wg.Go(func() {
			<-start
			errs[i] = pgx.BeginFunc(t.Context(), f.pool, func(tx pgx.Tx) error {
				var err error
				results[i], err = f.store.Accept(t.Context(), tx, "erp", order42, queue)
				return err
			})
		})
	}
	close(start)
	wg.Wait()
	news := 0
	for i := range deliveries {
		require.NoError(t, errs[i])
		if results[i] == inbox.NewMessage {
			news++
		} else {
			require.Equal(t, inbox.Duplicate, results[i])
		}
	}
	require.Equal(t, 1, news)
	require.Equal(t, 1, f.accepted(t))

	// Another consumer keeps its own record of the same message.
	res, err := f.store.Accept(t.Context(), f.pool, "billing", order42, queue)
	require.NoError(t, err)
	require.Equal(t, inbox.NewMessage, res)
}

func TestDigestMismatchIsQuarantined(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := t.Context()
	_, err := f.store.Accept(ctx, f.pool, "erp", order42, queue)
	require.NoError(t, err)

	forged := order42
	forged.Body = []byte(`{"order":43}`)
	forged.Headers = map[string]string{"traceparent": "00-abc-def-01"}
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.store.Accept(ctx, tx, "erp", forged, queue)
		require.ErrorIs(t, err, inbox.ErrDigestMismatch)
		return nil // commit: keep the quarantine row, do no work
	})
	require.NoError(t, err)

	q, err := f.store.ListQuarantined(ctx, f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 1)
	require.Equal(t, "evt-42", q[0].MessageID)
	require.Equal(t, inbox.Digest(forged.Body), q[0].PayloadDigest)
	require.Equal(t, forged.Body, q[0].Payload)
	require.Equal(t, queue, q[0].Source)
	require.Equal(t, forged.Headers, q[0].Headers)
	require.Contains(t, q[0].Reason, inbox.Digest(order42.Body))
	require.Equal(t, 1, f.accepted(t), "the accepted row is unchanged")
}

// The caller's work failed and its transaction rolled back: no inbox row
// remains, so the redelivery is processed as new.
func TestRolledBackWorkLeavesNoRecord(t *testing.T) {
	t.Parallel()
	f := setup(t, 4)
	ctx := t.Context()
	workFailed := errors.New("ERP write failed")
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		res, err := f.store.Accept(ctx, tx, "erp", order42, queue)
		require.NoError(t, err)
		require.Equal(t, inbox.NewMessage, res)
		return workFailed
	})
	require.ErrorIs(t, err, workFailed)
	require.Zero(t, f.accepted(t))

	res, err := f.store.Accept(ctx, f.pool, "erp", order42, queue)
	require.NoError(t, err)
	require.Equal(t, inbox.NewMessage, res, "the redelivery is processed")
}

func TestAcceptRejectsBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	noID := order42
	noID.ID = ""
	_, err := f.store.Accept(t.Context(), f.pool, "erp", noID, queue)
	require.ErrorIs(t, err, inbox.ErrInvalidMessage)
	require.ErrorContains(t, err, "Message.ID")
	_, err = f.store.Accept(t.Context(), f.pool, "", order42, queue)
	require.ErrorContains(t, err, "consumer")
	require.Zero(t, f.accepted(t))

	// A message without an id can still be kept for inspection.
	id, err := f.store.Quarantine(t.Context(), f.pool, "erp", noID, queue, "no message id")
	require.NoError(t, err)
	require.Positive(t, id)

	_, err = inbox.NewStore(inbox.Config{Retention: time.Minute})
	require.ErrorContains(t, err, "sender's retries")
}

func TestPruneKeepsTheRetentionWindow(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	ctx := t.Context()
	for _, id := range []string{"old-1", "old-2", "fresh"} {
		msg := order42
		msg.ID = id
		_, err := f.store.Accept(ctx, f.pool, "erp", msg, queue)
		require.NoError(t, err)
	}
	_, err := f.pool.Exec(ctx, "UPDATE "+f.schema+".inbox SET received_at = now() - interval '8 days' WHERE message_id LIKE 'old-%'")
	require.NoError(t, err)

	n, err := f.store.Prune(ctx, f.pool, 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "batches continue until the old rows are gone")
	require.Equal(t, 1, f.accepted(t))
	res, err := f.store.Accept(ctx, f.pool, "erp", broker.Message{ID: "fresh", Body: order42.Body}, queue)
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, res, "ids within the retention are still recognised")
}
