package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
)

// waitLimit bounds every wait that should end at once, so a broken broker
// fails the test instead of hanging it.
const waitLimit = 2 * time.Second

func newBroker(t *testing.T, cfg memory.Config) *memory.Broker {
	t.Helper()
	b := memory.New(cfg)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// msg is a message on topic "t", which most tests use.
func msg(id, key string) broker.Message {
	return broker.Message{ID: id, Topic: "t", Key: key, Body: []byte("body of " + id)}
}

func publish(t *testing.T, b *memory.Broker, msgs ...broker.Message) {
	t.Helper()
	require.NoError(t, b.Publisher().Publish(t.Context(), msgs))
}

// receive takes the next delivery, failing the test if none comes soon.
func receive(t *testing.T, c broker.Consumer) *memory.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	d, err := c.Receive(ctx)
	require.NoError(t, err)
	md, ok := d.(*memory.Delivery)
	require.True(t, ok, "the memory broker delivers *memory.Delivery")
	return md
}

// requireNothing asserts that c has nothing to receive now.
func requireNothing(t *testing.T, c broker.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	d, err := c.Receive(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "unexpected delivery %+v", d)
}

// receiveAsync starts a Receive that the test expects to block, and returns
// where its outcome will arrive.
func receiveAsync(ctx context.Context, c broker.Consumer) <-chan result {
	out := make(chan result, 1)
	go func() {
		d, err := c.Receive(ctx)
		out <- result{d, err}
	}()
	return out
}

type result struct {
	d   broker.Delivery
	err error
}

func await(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitLimit):
		require.FailNow(t, "Receive did not return")
		return result{}
	}
}

func TestPublishConfirmedThenReceived(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t, memory.Config{})
	c := b.Consumer("invoices")

	sent := []broker.Message{
		{ID: "1", Topic: "invoices", Key: "acme", Headers: map[string]string{"type": "invoice.created"}, Body: []byte(`{"n":1}`)},
		{ID: "2", Topic: "invoices", Body: []byte(`{"n":2}`)},
		{ID: "3", Topic: "invoices", Key: "globex"},
		{ID: "other", Topic: "payments"},
		{ID: "4", Topic: "invoices", Key: "acme"},
	}
	require.NoError(t, b.Publisher().Publish(ctx, sent))
	require.Equal(t, 4, b.Published("invoices"))
	require.Equal(t, 1, b.Published("payments"))
	require.Zero(t, b.Published("nobody"))

	for _, want := range []broker.Message{sent[0], sent[1], sent[2], sent[4]} {
		d := receive(t, c)
		if want.Body == nil {
			want.Body = []byte{} // no null payload here: nil is received as empty
		}
		require.Equal(t, want, d.Message())
		require.NotNil(t, d.Message().Body)
		require.Equal(t, broker.Source{Queue: "invoices"}, d.Source())
		require.Equal(t, 1, d.Attempt())
		require.NoError(t, d.Ack(ctx))
	}
	requireNothing(t, c)
	require.Equal(t, "other", receive(t, b.Consumer("payments")).Message().ID, "topics have separate queues")
	require.Equal(t, 4, b.Published("invoices"), "Published counts confirmations, not what is left")
}

func TestMessagesAreCopied(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t, memory.Config{})
	c := b.Consumer("t")

	m := broker.Message{ID: "1", Topic: "t", Headers: map[string]string{"h": "v"}, Body: []byte("abc")}
	publish(t, b, m)
	m.Headers["h"] = "changed by the publisher"
	m.Body[0] = 'X'

	d := receive(t, c)
	require.Equal(t, "v", d.Message().Headers["h"])
	require.Equal(t, "abc", string(d.Message().Body))
	d.Message().Headers["h"] = "changed by the receiver"
	d.Message().Body[0] = 'Y'
	require.NoError(t, d.Nack(ctx))

	d = receive(t, c)
	require.Equal(t, "v", d.Message().Headers["h"], "a redelivery is what was published")
	require.Equal(t, "abc", string(d.Message().Body))
	require.NoError(t, d.Reject(ctx, errors.New("unprocessable")))
	dead := b.DeadLetters("t")
	dead[0].Body[0] = 'Z'
	require.Equal(t, "abc", string(b.DeadLetters("t")[0].Body))
}

func TestFailPublishFailsChosenMessages(t *testing.T) {
	t.Parallel()
	injected := errors.New("injected: no confirm")
	b := newBroker(t, memory.Config{FailPublish: func(m broker.Message) error {
		if m.Key == "fail" {
			return injected
		}
		return nil
	}})
	c := b.Consumer("t")

	msgs := make([]broker.Message, 10)
	failing := map[int]bool{1: true, 4: true, 5: true, 9: true}
	for i := range msgs {
		key := "ok"
		if failing[i] {
			key = "fail"
		}
		msgs[i] = msg(strconv.Itoa(i), key)
	}
	err := b.Publisher().Publish(t.Context(), msgs)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, len(failing))
	require.ErrorIs(t, err, injected)

	for i, f := range broker.Failures(len(msgs), err) {
		if failing[i] {
			require.ErrorIs(t, f, injected, "message %d", i)
			require.ErrorContains(t, f, fmt.Sprintf("%q", msgs[i].ID), "the failure names the message")
		} else {
			require.NoError(t, f, "message %d", i)
		}
	}
	require.Equal(t, len(msgs)-len(failing), b.Published("t"))

	// Exactly the confirmed messages are queued, in call order.
	for i := range msgs {
		if failing[i] {
			continue
		}
		d := receive(t, c)
		require.Equal(t, msgs[i].ID, d.Message().ID)
		require.NoError(t, d.Ack(t.Context()))
	}
	requireNothing(t, c)
}

func TestPublishValidationNamesTheField(t *testing.T) {
	t.Parallel()
	var asked []string
	var mu sync.Mutex
	b := newBroker(t, memory.Config{FailPublish: func(m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, m.ID)
		return nil
	}})

	msgs := []broker.Message{
		{Topic: "t", Body: []byte("no id")},
		{ID: "no-topic"},
		msg("fine", ""),
	}
	err := b.Publisher().Publish(t.Context(), msgs)
	failures := broker.Failures(len(msgs), err)
	require.ErrorIs(t, failures[0], memory.ErrInvalidMessage)
	require.ErrorContains(t, failures[0], "ID is empty")
	require.ErrorIs(t, failures[1], memory.ErrInvalidMessage)
	require.ErrorContains(t, failures[1], "Topic is empty")
	require.ErrorContains(t, failures[1], `"no-topic"`)
	require.NoError(t, failures[2])
	require.Equal(t, 1, b.Published("t"))
	require.Equal(t, []string{"fine"}, asked, "invalid messages never reach FailPublish")
}

func TestPublishAllOrNothingErrors(t *testing.T) {
	t.Parallel()
	msgs := []broker.Message{msg("1", ""), msg("2", "")}

	t.Run("context", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := b.Publisher().Publish(ctx, msgs)
		require.ErrorIs(t, err, context.Canceled)
		for _, f := range broker.Failures(len(msgs), err) {
			require.ErrorIs(t, f, context.Canceled)
		}
		require.Zero(t, b.Published("t"))
	})
	t.Run("context ends during FailPublish", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		b := newBroker(t, memory.Config{FailPublish: func(m broker.Message) error {
			if m.ID == "2" {
				cancel()
			}
			return nil
		}})
		require.ErrorIs(t, b.Publisher().Publish(ctx, msgs), context.Canceled)
		require.Zero(t, b.Published("t"), "nothing is enqueued when the call fails as a whole")
	})
	t.Run("closed publisher", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		p := b.Publisher()
		require.NoError(t, p.Close())
		require.NoError(t, p.Close(), "Close is idempotent")
		require.ErrorIs(t, p.Publish(t.Context(), msgs), broker.ErrClosed)
		require.NoError(t, b.Publisher().Publish(t.Context(), msgs), "other publishers are unaffected")
	})
	t.Run("closed broker", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		p := b.Publisher()
		require.NoError(t, b.Close())
		require.ErrorIs(t, p.Publish(t.Context(), msgs), broker.ErrClosed)
		require.ErrorIs(t, b.Publisher().Publish(t.Context(), msgs), broker.ErrClosed)
		require.Zero(t, b.Published("t"))
	})
	t.Run("empty", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		require.NoError(t, b.Publisher().Publish(t.Context(), nil))
	})
}

func TestCompetingConsumersSplitWorkButNotKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t, memory.Config{})
	c1, c2 := b.Consumer("t"), b.Consumer("t")
	publish(t, b, msg("k1", "k"), msg("k2", "k"), msg("x1", ""), msg("y1", "y"))

	d1 := receive(t, c1)
	require.Equal(t, "k1", d1.Message().ID)
	d2 := receive(t, c2)
	require.Equal(t, "x1", d2.Message().ID, "k2 waits while k1 is in flight; the next message goes to the other consumer")
	d3 := receive(t, c1)
	require.Equal(t, "y1", d3.Message().ID)
	requireNothing(t, c2)

	// A Receive blocked on the locked key wakes when the key is released.
	blocked := receiveAsync(ctx, c2)
	require.NoError(t, d1.Ack(ctx))
	r := await(t, blocked)
	require.NoError(t, r.err)
	require.Equal(t, "k2", r.d.Message().ID)
	for _, d := range []broker.Delivery{d2, d3, r.d} {
		require.NoError(t, d.Ack(ctx))
	}
}

// Four consumers race for 20 keys × 50 messages plus keyless ones, nacking
// at random, while a publisher keeps publishing and the first consumer to
// reach its 30th delivery drops its connection in the middle of it. Every key must be received in publish order,
// never by two consumers at once, and every message acknowledged once.
func TestCompetingConsumersKeepKeyOrderUnderRedelivery(t *testing.T) {
	t.Parallel()
	const (
		consumers = 4
		keys      = 20
		perKey    = 50
		keyless   = 100
		total     = keys*perKey + keyless
	)
	b := newBroker(t, memory.Config{})

	// Messages interleave keys, as events of many tenants would, with a
	// keyless one after every tenth.
	var all []broker.Message
	index := map[string]int{} // ID -> position within its key
	for i := range perKey {
		for k := range keys {
			m := msg(fmt.Sprintf("k%02d-%03d", k, i), fmt.Sprintf("k%02d", k))
			index[m.ID] = i
			all = append(all, m)
			if (i*keys+k)%(keys*perKey/keyless) == 0 {
				all = append(all, msg(fmt.Sprintf("free-%04d", len(all)), ""))
			}
		}
	}
	require.Len(t, all, total)

	var (
		mu         sync.Mutex
		next       = map[string]int{}  // key -> position of its next expected message
		inFlight   = map[string]bool{} // key -> held by some consumer
		acks       = map[string]int{}  // ID -> acknowledgements
		remaining  = total
		violations []string
	)
	fail := func(format string, args ...any) {
		violations = append(violations, fmt.Sprintf(format, args...))
	}
	ctx, stop := context.WithTimeout(t.Context(), 10*time.Second)
	defer stop()

	var dropped atomic.Bool // one consumer drops its connection, once
	var wg sync.WaitGroup
	wg.Go(func() {
		p := b.Publisher()
		for batch := range len(all) / 25 {
			if err := p.Publish(ctx, all[batch*25:(batch+1)*25]); err != nil {
				mu.Lock()
				fail("publish: %v", err)
				mu.Unlock()
			}
		}
	})
	for n := range consumers {
		wg.Go(func() {
			c := b.Consumer("t")
			defer func() { _ = c.Close() }()
			for received := 1; ; received++ {
				d, err := c.Receive(ctx)
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						mu.Lock()
						fail("consumer %d: receive: %v", n, err)
						mu.Unlock()
					}
					return
				}
				m := d.Message()
				mu.Lock()
				if m.Key != "" {
					if inFlight[m.Key] {
						fail("key %s delivered twice at once (%s)", m.Key, m.ID)
					}
					inFlight[m.Key] = true
					if index[m.ID] != next[m.Key] {
						fail("key %s: got message %d, want %d", m.Key, index[m.ID], next[m.Key])
					}
				}
				mu.Unlock()

				dropConnection := received == 30 && dropped.CompareAndSwap(false, true)
				nack := rand.IntN(5) == 0

				// The bookkeeping is done before the verdict: once it is
				// given, the key's next message may be delivered at once.
				mu.Lock()
				delete(inFlight, m.Key)
				if !dropConnection && !nack {
					next[m.Key]++
					acks[m.ID]++
					remaining--
					if remaining == 0 {
						stop()
					}
				}
				mu.Unlock()

				var err2 error
				switch {
				case dropConnection:
					err2 = c.Close()
				case nack:
					err2 = d.Nack(context.WithoutCancel(ctx))
				default:
					err2 = d.Ack(context.WithoutCancel(ctx))
				}
				if err2 != nil {
					mu.Lock()
					fail("consumer %d: settle %s: %v", n, m.ID, err2)
					mu.Unlock()
				}
				if dropConnection {
					return
				}
			}
		})
	}
	wg.Wait()

	require.Empty(t, violations)
	require.True(t, dropped.Load(), "a consumer dropped its connection mid-delivery")
	require.Zero(t, remaining, "every message is acknowledged")
	require.Len(t, acks, total)
	for id, n := range acks {
		require.Equal(t, 1, n, "message %s acknowledged %d times", id, n)
	}
	for k := range keys {
		require.Equal(t, perKey, next[fmt.Sprintf("k%02d", k)])
	}
	require.Equal(t, total, b.Published("t"))
}

func TestNackRedeliversAtTheFrontOfItsKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t, memory.Config{})
	c := b.Consumer("t")
	publish(t, b, msg("k1", "k"), msg("k2", "k"), msg("x1", ""))

	d := receive(t, c)
	require.Equal(t, "k1", d.Message().ID)
	require.NoError(t, d.Nack(ctx))

	d = receive(t, c)
	require.Equal(t, "k1", d.Message().ID, "a redelivered message keeps its place")
	require.Equal(t, 2, d.Attempt())
	require.NoError(t, d.Nack(ctx))
	d = receive(t, b.Consumer("t"))
	require.Equal(t, "k1", d.Message().ID, "any consumer of the topic may get the redelivery")
	require.Equal(t, 3, d.Attempt())
	require.NoError(t, d.Ack(ctx))

	for _, want := range []string{"k2", "x1"} {
		d = receive(t, c)
		require.Equal(t, want, d.Message().ID)
		require.Equal(t, 1, d.Attempt())
		require.NoError(t, d.Ack(ctx))
	}
	requireNothing(t, c)
}

func TestNackHonoursRedeliveryDelay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const delay = 60 * time.Millisecond
	b := newBroker(t, memory.Config{RedeliveryDelay: delay})
	c := b.Consumer("t")
	publish(t, b, msg("k1", "k"), msg("k2", "k"), msg("x1", ""))

	d := receive(t, c)
	require.Equal(t, "k1", d.Message().ID)
	nacked := time.Now()
	require.NoError(t, d.Nack(ctx))

	d = receive(t, c)
	require.Equal(t, "x1", d.Message().ID, "other keys are not held up by the delay")
	require.Less(t, time.Since(nacked), delay)
	require.NoError(t, d.Ack(ctx))

	// k2 waits behind k1's delay; the blocked Receive wakes when it ends.
	d = receive(t, c)
	require.GreaterOrEqual(t, time.Since(nacked), delay)
	require.Equal(t, "k1", d.Message().ID)
	require.Equal(t, 2, d.Attempt())
	require.NoError(t, d.Ack(ctx))
	require.Equal(t, "k2", receive(t, c).Message().ID)
}

func TestRejectDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t, memory.Config{})
	c := b.Consumer("t")
	publish(t, b, msg("k1", "k"), msg("k2", "k"), msg("x1", ""))
	require.Nil(t, b.DeadLetters("t"))

	d := receive(t, c)
	require.Equal(t, "k1", d.Message().ID)
	require.NoError(t, d.Reject(ctx, errors.New("malformed")))
	d = receive(t, c)
	require.Equal(t, "k2", d.Message().ID, "a rejected message releases its key")
	require.NoError(t, d.Ack(ctx))
	d = receive(t, c)
	require.NoError(t, d.Reject(ctx, nil))
	requireNothing(t, c)

	require.Equal(t, []broker.Message{msg("k1", "k"), msg("x1", "")}, b.DeadLetters("t"))
	require.Nil(t, b.DeadLetters("other"))
}

func TestConsumerCloseRedeliversUnsettled(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newBroker(t, memory.Config{RedeliveryDelay: time.Hour})
	c1, c2 := b.Consumer("t"), b.Consumer("t")
	publish(t, b, msg("k1", "k"), msg("k2", "k"), msg("x1", ""), msg("y1", ""))

	held1, held2 := receive(t, c1), receive(t, c1)
	require.Equal(t, []string{"k1", "x1"}, []string{held1.Message().ID, held2.Message().ID})
	acked := receive(t, c1)
	require.Equal(t, "y1", acked.Message().ID)
	require.NoError(t, acked.Ack(ctx))
	requireNothing(t, c2)

	blocked := receiveAsync(ctx, c1)
	require.NoError(t, c1.Close())
	require.NoError(t, c1.Close(), "Close is idempotent")
	require.ErrorIs(t, await(t, blocked).err, broker.ErrClosed, "a blocked Receive returns on Close")
	_, err := c1.Receive(ctx)
	require.ErrorIs(t, err, broker.ErrClosed)

	// Redelivered at once (RedeliveryDelay is for Nack), in publish order,
	// k1 still ahead of k2.
	again1, again2 := receive(t, c2), receive(t, c2)
	require.Equal(t, []string{"k1", "x1"}, []string{again1.Message().ID, again2.Message().ID})
	require.Equal(t, []int{2, 2}, []int{again1.Attempt(), again2.Attempt()})
	requireNothing(t, c2)
	require.NoError(t, again1.Ack(ctx))
	require.NoError(t, again2.Ack(ctx))
	d := receive(t, c2)
	require.Equal(t, "k2", d.Message().ID)
	require.NoError(t, d.Ack(ctx))

	err = held1.Ack(ctx)
	require.ErrorIs(t, err, broker.ErrClosed, "the closed consumer's deliveries were handed back")
	require.ErrorContains(t, err, "consumer was closed")
	require.ErrorIs(t, held2.Nack(ctx), broker.ErrClosed)
	require.ErrorIs(t, acked.Ack(ctx), memory.ErrAlreadySettled)
	requireNothing(t, c2)
}

func TestReceiveUnblocks(t *testing.T) {
	t.Parallel()

	t.Run("context", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		ctx, cancel := context.WithCancel(t.Context())
		blocked := receiveAsync(ctx, b.Consumer("t"))
		cancel()
		require.ErrorIs(t, await(t, blocked).err, context.Canceled)
	})
	t.Run("new message", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		blocked := receiveAsync(t.Context(), b.Consumer("t"))
		publish(t, b, msg("1", ""))
		r := await(t, blocked)
		require.NoError(t, r.err)
		require.Equal(t, "1", r.d.Message().ID)
		require.NoError(t, r.d.Ack(t.Context()))
	})
	t.Run("broker close", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{RedeliveryDelay: time.Hour})
		publish(t, b, msg("1", ""))
		d := receive(t, b.Consumer("t"))
		require.NoError(t, d.Nack(t.Context())) // one Receive waits on the delay timer
		var waits []<-chan result
		for _, topic := range []string{"t", "t", "u"} {
			waits = append(waits, receiveAsync(t.Context(), b.Consumer(topic)))
		}
		require.NoError(t, b.Close())
		require.NoError(t, b.Close(), "Close is idempotent")
		for _, w := range waits {
			require.ErrorIs(t, await(t, w).err, broker.ErrClosed)
		}
		_, err := b.Consumer("t").Receive(t.Context())
		require.ErrorIs(t, err, broker.ErrClosed, "a consumer created after Close is closed")
		require.NoError(t, b.Consumer("t").Close())
		require.Equal(t, 1, b.Published("t"), "counts survive Close")
	})
}

func TestSettleOnce(t *testing.T) {
	t.Parallel()
	verdicts := map[string]func(context.Context, broker.Delivery) error{
		"ack":    func(ctx context.Context, d broker.Delivery) error { return d.Ack(ctx) },
		"nack":   func(ctx context.Context, d broker.Delivery) error { return d.Nack(ctx) },
		"reject": func(ctx context.Context, d broker.Delivery) error { return d.Reject(ctx, errors.New("bad")) },
	}
	for first, settle := range verdicts {
		for second, again := range verdicts {
			t.Run(first+" then "+second, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				b := newBroker(t, memory.Config{})
				c := b.Consumer("t")
				publish(t, b, msg("1", "k"))
				d := receive(t, c)
				require.NoError(t, settle(ctx, d))
				err := again(ctx, d)
				require.ErrorIs(t, err, memory.ErrAlreadySettled)
				require.ErrorContains(t, err, second)

				// The second verdict changed nothing.
				if first == "nack" {
					require.Equal(t, 2, receive(t, c).Attempt())
				} else {
					requireNothing(t, c)
				}
				dead := 0
				if first == "reject" {
					dead = 1
				}
				require.Len(t, b.DeadLetters("t"), dead)
			})
		}
	}
}

func TestSettleFailures(t *testing.T) {
	t.Parallel()

	// A verdict given with an ended context (a settle deadline that passed)
	// still takes effect: the message is never left held, its key's later
	// messages waiting behind it until Close.
	t.Run("ended context", func(t *testing.T) {
		t.Parallel()
		ended, cancel := context.WithCancel(t.Context())
		cancel()
		b := newBroker(t, memory.Config{})
		c := b.Consumer("t")
		publish(t, b, msg("1", "k"), msg("2", "k"), msg("3", "k"))

		require.NoError(t, receive(t, c).Nack(ended))
		again := receive(t, c)
		require.Equal(t, "1", again.Message().ID, "nacked: delivered again")
		require.Equal(t, 2, again.Attempt())
		require.NoError(t, again.Ack(ended))
		next := receive(t, c)
		require.Equal(t, "2", next.Message().ID, "acked: the key's next message follows")
		require.NoError(t, next.Reject(ended, errors.New("bad")))
		require.Equal(t, "3", receive(t, c).Message().ID, "rejected: the key's next message follows")
		require.Len(t, b.DeadLetters("t"), 1)
		require.ErrorIs(t, again.Ack(t.Context()), memory.ErrAlreadySettled)
	})
	t.Run("closed broker", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		publish(t, b, msg("1", ""))
		d := receive(t, b.Consumer("t"))
		require.NoError(t, b.Close())
		err := d.Ack(t.Context())
		require.ErrorIs(t, err, broker.ErrClosed)
		require.ErrorContains(t, err, "broker was closed")
	})
	t.Run("empty topic", func(t *testing.T) {
		t.Parallel()
		b := newBroker(t, memory.Config{})
		_, err := b.Consumer("").Receive(t.Context())
		require.ErrorContains(t, err, "topic is empty")
	})
}
