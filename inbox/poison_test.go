package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/validate"
)

// disguised delivers the messages published with an id it knows as
// another producer could have sent them: the memory broker refuses what a
// real broker delivers.
type disguised struct {
	broker.Consumer
	as map[string]broker.Message
}

func (c disguised) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err != nil {
		return d, err
	}
	if m, ok := c.as[d.Message().ID]; ok {
		return asDelivery{Delivery: d, msg: m}, nil
	}
	return d, nil
}

type asDelivery struct {
	broker.Delivery
	msg broker.Message
}

func (d asDelivery) Message() broker.Message { return d.msg }

// poisons are messages the ingress can never accept, by what is wrong.
func poisons() map[string]broker.Message {
	return map[string]broker.Message{
		"no id":                 {Topic: "erp", Body: []byte(`{}`)},
		"tombstone without id":  {Topic: "erp"},
		"tombstone with id":     {ID: "tomb-1", Topic: "erp"},
		"id with control char":  {ID: "evt-\x07", Topic: "erp", Body: []byte(`{}`)},
		"id not UTF-8":          {ID: "evt-\xff\xfe", Topic: "erp", Body: []byte{}},
		"id of 300 bytes":       {ID: strings.Repeat("x", 300), Topic: "erp", Body: []byte(`{}`)},
		"id with NUL":           {ID: "evt-\x00", Topic: "erp", Body: []byte(`{}`)},
		"header value not UTF8": {ID: "hdr-1", Topic: "erp", Headers: map[string]string{"traceparent": "\xc3\x28"}, Body: []byte(`{}`)},
		"header key with NUL":   {ID: "hdr-2", Topic: "erp", Headers: map[string]string{"a\x00b": "v"}, Body: []byte(`{}`)},
		"handler: malformed":    {ID: "bad-json", Topic: "erp", Body: []byte("not json")},
		"handler: invalid":      {ID: "bad-params", Topic: "erp", Body: []byte(`{"params":"invalid"}`)},
	}
}

// Each kind of message the ingress can never accept, among 300 good ones,
// in batches and one by one: every good message is handled once, every
// poison is quarantined once, as received (its id's bytes, a null body
// distinct from an empty one, its headers' bytes), and rejected once,
// without reaching the handler unless the handler is what refused it.
func TestIngressQuarantinesWhatItCanNeverAccept(t *testing.T) {
	t.Parallel()
	for _, maxBatch := range []int{1, 50} {
		t.Run(fmt.Sprintf("MaxBatch %d", maxBatch), func(t *testing.T) {
			t.Parallel()
			f := setupERP(t)
			var (
				mu    sync.Mutex
				calls = map[string]int{}
			)
			handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
				mu.Lock()
				calls[msg.ID]++
				mu.Unlock()
				switch string(msg.Body) {
				case "not json":
					return inbox.Malformed(errors.New("body is not JSON"))
				case `{"params":"invalid"}`:
					return fmt.Errorf("enqueueing: %w", &validate.Error{Kind: errors.New("jobs: invalid params"), Field: "Params", Problem: "is not an object"})
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".erp_ops (message_id) VALUES ($1)", msg.ID)
				return err
			}
			as := map[string]broker.Message{}
			var msgs []broker.Message
			for i := range 300 {
				msgs = append(msgs, broker.Message{ID: fmt.Sprintf("op-%d", i), Topic: "erp", Body: []byte(`{}`)})
				if i%25 == 0 && len(as) < len(poisons()) {
					for kind, m := range poisons() {
						if _, done := as["poison/"+kind]; !done {
							as["poison/"+kind] = m
							msgs = append(msgs, broker.Message{ID: "poison/" + kind, Topic: "erp", Body: []byte(`{}`)})
							break
						}
					}
				}
			}
			for kind, m := range poisons() { // any not placed yet
				if _, done := as["poison/"+kind]; !done {
					as["poison/"+kind] = m
					msgs = append(msgs, broker.Message{ID: "poison/" + kind, Topic: "erp", Body: []byte(`{}`)})
				}
			}
			f.publish(t, msgs...)
			in, err := f.store.NewIngress(f.pool, disguised{f.broker.Consumer("erp"), as}, inbox.IngressConfig{
				Consumer: "erp", Handler: handler, MaxBatch: maxBatch, Linger: 20 * time.Millisecond})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- in.Run(ctx) }()
			require.Eventually(t, func() bool {
				return f.ops(t) == 300 && len(f.broker.DeadLetters("erp")) == len(poisons())
			}, 20*time.Second, 10*time.Millisecond, "every good message handled, every poison rejected")
			cancel()
			require.NoError(t, <-done)

			// A handler may run twice for a message, the first time in a
			// whole batch that rolled back; each committed once.
			require.Equal(t, 300, f.accepted(t), "every good message accepted once")
			require.Len(t, f.broker.DeadLetters("erp"), len(poisons()), "each poison rejected once")
			q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 100)
			require.NoError(t, err)
			require.Len(t, q, len(poisons()), "each poison quarantined once")
			// Two poisons have no id: one has a null body.
			byID := map[string]inbox.Quarantined{}
			key := func(id string, body []byte) string { return fmt.Sprintf("%s|%t", id, body == nil) }
			for _, row := range q {
				byID[key(row.MessageID, row.Payload)] = row
			}
			for kind, m := range poisons() {
				row, ok := byID[key(m.ID, m.Body)]
				require.True(t, ok, "%s: quarantined under its id's bytes %q", kind, m.ID)
				require.Equal(t, m.Body == nil, row.Payload == nil, "%s: a null body stays null, an empty one empty", kind)
				require.Equal(t, string(m.Body), string(row.Payload), kind)
				require.Len(t, row.Headers, len(m.Headers), kind)
				for k, v := range m.Headers {
					require.Equal(t, v, row.Headers[k], "%s: header bytes kept", kind)
				}
				if !strings.HasPrefix(kind, "handler:") {
					require.Zero(t, calls[m.ID], "%s: the handler never saw it", kind)
					require.Contains(t, row.Reason, "Message.", kind)
				}
			}
			require.Contains(t, byID[key("bad-params", []byte{})].Reason, "is not an object")
			require.Contains(t, byID[key("", nil)].Reason, "no id")
		})
	}
}

// A handler that fails one message forever, with an error the ingress
// cannot classify or by panicking, has it quarantined and rejected at its
// MaxAttempts-th failure while the others are handled; a message failing
// with transient errors more often than that is retried until it passes.
func TestIngressCapsFailures(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	b := memory.New(memory.Config{RedeliveryDelay: 5 * time.Millisecond})
	var forever, panics, flaky atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		switch msg.ID {
		case "forever":
			forever.Add(1)
			return errors.New("ERP says no")
		case "panics":
			panics.Add(1)
			panic("handler bug")
		case "flaky":
			if flaky.Add(1) <= 8 {
				return inbox.Transient(errors.New("ERP unavailable"))
			}
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".erp_ops (message_id) VALUES ($1)", msg.ID)
		return err
	}
	msgs := []broker.Message{
		{ID: "forever", Topic: "erp", Body: []byte(`{}`)},
		{ID: "panics", Topic: "erp", Body: []byte(`{}`)},
		{ID: "flaky", Topic: "erp", Body: []byte(`{}`)},
	}
	for i := range 50 {
		msgs = append(msgs, broker.Message{ID: fmt.Sprintf("op-%d", i), Topic: "erp", Body: []byte(`{}`)})
	}
	require.NoError(t, b.Publisher().Publish(t.Context(), msgs))
	// One delivery a transaction, so that each failure is met once (in a
	// batch it is met twice, whole and in its savepoint; only the second
	// counts).
	in, err := f.store.NewIngress(f.pool, b.Consumer("erp"), inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxAttempts: 3, MaxBatch: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool {
		return f.ops(t) == 51 && len(b.DeadLetters("erp")) == 2
	}, 20*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	require.Equal(t, int32(3), forever.Load(), "quarantined at the third failure")
	require.Equal(t, int32(3), panics.Load())
	require.Equal(t, int32(9), flaky.Load(), "transient failures are not counted")
	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 2)
	reasons := map[string]string{q[0].MessageID: q[0].Reason, q[1].MessageID: q[1].Reason}
	require.Contains(t, reasons["forever"], inbox.ErrTooManyAttempts.Error())
	require.Contains(t, reasons["forever"], "3 failures, the last: ERP says no")
	require.Contains(t, reasons["panics"], "handler bug")
}

// A message whose work fails at commit (a deferred constraint) every time
// fails alone: its batch's other messages commit, and it is quarantined
// at its MaxAttempts-th failure.
func TestIngressCommitFailureStaysWithItsMessage(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".parent (id int PRIMARY KEY); "+
		"CREATE TABLE "+f.schema+".child (parent int REFERENCES "+f.schema+".parent DEFERRABLE INITIALLY DEFERRED)")
	require.NoError(t, err)
	b := memory.New(memory.Config{RedeliveryDelay: 5 * time.Millisecond})
	handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		if msg.ID == "orphan" {
			if _, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".child VALUES (1)"); err != nil {
				return err
			}
		}
		return f.handler(ctx, tx, msg)
	}
	require.NoError(t, b.Publisher().Publish(t.Context(), opsWith(20, 10, "orphan")))
	in, err := f.store.NewIngress(f.pool, b.Consumer("erp"), inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxAttempts: 2, MaxBatch: 21, Linger: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool {
		return f.ops(t) == 20 && len(b.DeadLetters("erp")) == 1
	}, 20*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 1)
	require.Equal(t, "orphan", q[0].MessageID)
	require.Contains(t, q[0].Reason, "foreign key")
}

// However many goroutines run the ingress, it uses at most Concurrency
// database connections at once.
func TestIngressConnectionBudget(t *testing.T) {
	t.Parallel()
	f := setup(t, 16)
	b := memory.New(memory.Config{})
	var busiest, acked atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, _ broker.Message) error {
		if n := f.pool.Stat().AcquiredConns(); n > busiest.Load() {
			busiest.Store(n)
		}
		_, err := tx.Exec(ctx, "SELECT pg_sleep(0.002)") // some work, so batches overlap
		return err
	}
	msgs := make([]broker.Message, 400)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("op-%d", i), Topic: "erp", Body: []byte(`{}`)}
	}
	require.NoError(t, b.Publisher().Publish(t.Context(), msgs))
	in, err := f.store.NewIngress(f.pool, countingAcks{b.Consumer("erp"), &acked}, inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxBatch: 5, Concurrency: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = in.Run(ctx) })
	}
	// Counted from the acks: a query here would take a connection of the
	// pool being measured.
	require.Eventually(t, func() bool { return acked.Load() == int32(len(msgs)) }, 30*time.Second, 10*time.Millisecond)
	cancel()
	wg.Wait()
	require.Equal(t, len(msgs), f.accepted(t))
	require.LessOrEqual(t, busiest.Load(), int32(2), "connections in use at once")
	require.Equal(t, int32(2), busiest.Load(), "the two slots were used together")
}

// countingAcks counts the acknowledgements of its deliveries.
type countingAcks struct {
	broker.Consumer
	acked *atomic.Int32
}

func (c countingAcks) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err != nil {
		return d, err
	}
	return countedAck{d, c.acked}, nil
}

type countedAck struct {
	broker.Delivery
	acked *atomic.Int32
}

func (d countedAck) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil {
		d.acked.Add(1)
	}
	return err
}

// failingReject is a consumer whose deliveries' first Reject fails, as a
// dead-letter produce can: the message is handed back instead.
type failingReject struct {
	broker.Consumer
	failed *atomic.Int32
}

func (c failingReject) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err != nil {
		return d, err
	}
	return rejectOnce{d, c.failed}, nil
}

type rejectOnce struct {
	broker.Delivery
	failed *atomic.Int32
}

func (d rejectOnce) Reject(ctx context.Context, reason error) error {
	if d.failed.Add(1) == 1 {
		if err := d.Nack(ctx); err != nil {
			return err
		}
		return errors.New("the dead-letter topic is unavailable")
	}
	return d.Delivery.Reject(ctx, reason)
}

// A quarantined message whose Reject failed comes back and is rejected
// again, without a second quarantine row.
func TestIngressQuarantinesOnceWhenTheRejectFails(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	var failed atomic.Int32
	in, err := f.store.NewIngress(f.pool, failingReject{f.broker.Consumer("erp"), &failed}, inbox.IngressConfig{Consumer: "erp", Handler: f.handler})
	require.NoError(t, err)
	f.publish(t, broker.Message{ID: "op-bad", Topic: "erp", Body: []byte("not json")})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool { return len(f.broker.DeadLetters("erp")) == 1 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, int32(2), failed.Load(), "rejected twice: the first failed")
	require.Equal(t, int32(1), f.calls.Load(), "the handler ran once")
	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 1, "quarantined once")
}

// settleRecorder is a consumer whose deliveries report how each was
// settled, by message id.
type settleRecorder struct {
	broker.Consumer
	settled chan string // "<id> ack", "<id> nack" or "<id> reject"
}

func (r settleRecorder) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := r.Consumer.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return recordedDelivery{Delivery: d, settled: r.settled}, nil
}

type recordedDelivery struct {
	broker.Delivery
	settled chan string
}

func (d recordedDelivery) Ack(ctx context.Context) error {
	d.settled <- d.Message().ID + " ack"
	return d.Delivery.Ack(ctx)
}

func (d recordedDelivery) Nack(ctx context.Context) error {
	d.settled <- d.Message().ID + " nack"
	return d.Delivery.Nack(ctx)
}

func (d recordedDelivery) Reject(ctx context.Context, reason error) error {
	d.settled <- d.Message().ID + " reject"
	return d.Delivery.Reject(ctx, reason)
}

// A failing message in a batch whose commit fails because of another
// message is handled again on its own, but its failure is counted once:
// with MaxAttempts 2 its first delivery is nacked, not quarantined.
func TestIngressCountsAFailureOncePerDelivery(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".parent (id int PRIMARY KEY); "+
		"CREATE TABLE "+f.schema+".child (parent int REFERENCES "+f.schema+".parent DEFERRABLE INITIALLY DEFERRED)")
	require.NoError(t, err)
	b := memory.New(memory.Config{RedeliveryDelay: time.Hour})
	var forever atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		if msg.ID == "forever" {
			forever.Add(1)
			return errors.New("ERP says no")
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".child VALUES (1)") // fails at commit
		return err
	}
	require.NoError(t, b.Publisher().Publish(t.Context(), []broker.Message{
		{ID: "forever", Topic: "erp", Body: []byte(`{}`)},
		{ID: "orphan", Topic: "erp", Body: []byte(`{}`)},
	}))
	c := settleRecorder{Consumer: b.Consumer("erp"), settled: make(chan string, 2)}
	in, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxAttempts: 2, MaxBatch: 2, Linger: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	settled := map[string]bool{}
	for range 2 {
		select {
		case s := <-c.settled:
			settled[s] = true
		case <-time.After(20 * time.Second):
			t.Fatal("the batch was not settled")
		}
	}
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, int32(3), forever.Load(), "handled whole, in its savepoint and on its own")
	require.Equal(t, map[string]bool{"forever nack": true, "orphan nack": true}, settled,
		"the first delivery's failure was counted more than once")
	require.Empty(t, b.DeadLetters("erp"))
}

// opsWith is n ERP operations op-0 … op-(n-1) on topic erp, with a message
// of id special after op-<after>.
func opsWith(n, after int, special string) []broker.Message {
	var msgs []broker.Message
	for i := range n {
		msgs = append(msgs, broker.Message{ID: fmt.Sprintf("op-%d", i), Topic: "erp", Body: []byte(`{}`)})
		if i == after {
			msgs = append(msgs, broker.Message{ID: special, Topic: "erp", Body: []byte(`{}`)})
		}
	}
	return msgs
}
