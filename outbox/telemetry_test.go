package outbox_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// An event written under a span is published in a producer span of the same
// trace, and the ingress that receives it continues that trace in a
// consumer span, which its handler runs in. The relay counts the
// publication and reports an empty backlog.
func TestTraceFromWriterThroughBrokerToIngress(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	tr := telemetrytest.NewTraces(t)
	m := telemetrytest.NewMetrics(t)
	b := memory.New(memory.Config{})

	ctx, writer := tr.Provider.Tracer("test").Start(t.Context(), "POST /orders")
	err := pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		_, err := f.store.Write(ctx, tx, outbox.Event{Topic: "orders", Key: "o-1", Type: "order.placed", Payload: json.RawMessage(`{"id":1}`)})
		return err
	})
	require.NoError(t, err)
	writer.End()

	inboxStore, err := inbox.NewStore(inbox.Config{Schema: f.db.Schema})
	require.NoError(t, err)
	handled := make(chan trace.SpanContext, 1)
	in, err := inboxStore.NewIngress(f.db.Pool, b.Consumer("orders"), inbox.IngressConfig{
		Consumer:       "erp",
		TracerProvider: tr.Provider,
		Handler: func(ctx context.Context, _ pgx.Tx, _ broker.Message) error {
			handled <- trace.SpanContextFromContext(ctx)
			return nil
		},
	})
	require.NoError(t, err)
	ingressCtx, stopIngress := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { _ = in.Run(ingressCtx) })
	t.Cleanup(func() { stopIngress(); wg.Wait() })

	f.runRelay(t, b.Publisher(), outbox.RelayConfig{TracerProvider: tr.Provider, MeterProvider: m.Provider, PollInterval: 20 * time.Millisecond})

	var inHandler trace.SpanContext
	select {
	case inHandler = <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("the ingress never handled the event")
	}
	require.Eventually(t, func() bool { return len(tr.Ended("process orders")) == 1 }, 5*time.Second, 10*time.Millisecond)
	publish := tr.Ended("publish orders")
	require.Len(t, publish, 1)
	consume := tr.Ended("process orders")[0]

	traceID := writer.SpanContext().TraceID()
	require.Equal(t, traceID, publish[0].SpanContext().TraceID())
	require.Equal(t, writer.SpanContext().SpanID(), publish[0].Parent().SpanID(), "the publish span is the writer's child")
	require.Equal(t, trace.SpanKindProducer, publish[0].SpanKind())
	require.Equal(t, traceID, consume.SpanContext().TraceID())
	require.Equal(t, publish[0].SpanContext().SpanID(), consume.Parent().SpanID(), "the consumer continues the publish span")
	require.True(t, consume.Parent().IsRemote())
	require.Equal(t, trace.SpanKindConsumer, consume.SpanKind())
	require.Equal(t, consume.SpanContext(), inHandler, "the handler runs in the consumer span")
	result, _ := telemetrytest.Attr(consume, "llmq.inbox.result")
	require.Equal(t, "accepted", result.AsString())

	require.Eventually(t, func() bool {
		n, _ := m.Collect(t).Int("llmq.outbox.events", attribute.String("result", "published"))
		return n == 1
	}, 5*time.Second, 10*time.Millisecond)
	r := m.Collect(t)
	n, _ := r.Histogram("llmq.outbox.publish.duration")
	require.Positive(t, n)
	_, ok := r.Int("llmq.outbox.pending")
	require.True(t, ok, "the backlog gauge reports while the relay runs")
	_, ok = r.Float("llmq.outbox.lag")
	require.True(t, ok)
}

// The backlog gauges match the table: unpublished events and the age of the
// oldest.
func TestRelayBacklogGauges(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	m := telemetrytest.NewMetrics(t)
	for range 3 {
		_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{Topic: "orders", Type: "order.placed", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	_, err := f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox SET created_at = now() - interval '10 minutes'")
	require.NoError(t, err)
	// A publisher that never confirms keeps the backlog where it is.
	refuse := publisherFunc(func(context.Context, []broker.Message) error { return context.DeadlineExceeded })
	relay, stop := f.runRelay(t, refuse, outbox.RelayConfig{MeterProvider: m.Provider, Backoff: llmqtype.BackoffPolicy{Base: time.Hour, Cap: time.Hour}})

	require.Eventually(t, func() bool {
		n, _ := m.Collect(t).Int("llmq.outbox.events", attribute.String("result", "failed"))
		return n == 3
	}, 10*time.Second, 10*time.Millisecond)
	r := m.Collect(t)
	pending, _ := r.Int("llmq.outbox.pending")
	require.EqualValues(t, f.pending(t), pending)
	require.EqualValues(t, 3, pending)
	lag, _ := r.Float("llmq.outbox.lag")
	require.InDelta(t, (10 * time.Minute).Seconds(), lag, 30)
	st, err := relay.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, st.Pending, pending, "the gauges report what Stats does")
	require.InDelta(t, st.OldestPending.Seconds(), lag, 30)

	// A stopped relay no longer reports the backlog.
	stop()
	_, ok := m.Collect(t).Int("llmq.outbox.pending")
	require.False(t, ok)
}

type publisherFunc func(ctx context.Context, msgs []broker.Message) error

func (p publisherFunc) Publish(ctx context.Context, msgs []broker.Message) error { return p(ctx, msgs) }

func (p publisherFunc) Close() error { return nil }
