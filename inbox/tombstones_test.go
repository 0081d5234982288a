package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
)

// Skipped tombstones in a batch with other messages: the others are
// handled in their own spans, each tombstone's span ends as skipped, and
// nothing of the tombstones is written.
func TestIngressSkipsTombstonesInABatch(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	msgs := []broker.Message{
		{ID: "op-1", Topic: "erp", Body: []byte(`{}`)},
		{ID: "tomb-1", Topic: "erp", Body: []byte(`{}`)},
		{ID: "op-2", Topic: "erp", Body: []byte(`{}`)},
		{ID: "tomb-2", Topic: "erp", Body: []byte(`{}`)},
		{ID: "op-3", Topic: "erp", Body: []byte(`{}`)},
	}
	as := map[string]broker.Message{
		"tomb-1": {ID: "tomb-1", Topic: "erp"}, // null bodies, as Kafka delivers tombstones
		"tomb-2": {Topic: "erp"},
	}
	f.publish(t, msgs...)
	traces := telemetrytest.NewTraces(t)
	var (
		mu      sync.Mutex
		spanIDs = map[string]trace.SpanID{}
	)
	handler := func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
		mu.Lock()
		spanIDs[msg.ID] = trace.SpanFromContext(ctx).SpanContext().SpanID()
		mu.Unlock()
		return f.handler(ctx, tx, msg)
	}
	in, err := f.store.NewIngress(f.pool, disguised{f.broker.Consumer("erp"), as}, inbox.IngressConfig{
		Consumer: "erp", Handler: handler, Tombstones: inbox.SkipTombstones, MaxBatch: 10, Linger: 50 * time.Millisecond,
		TracerProvider: traces.Provider})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, func() bool { return len(traces.Ended("process erp")) == len(msgs) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	require.Equal(t, 3, f.ops(t))
	require.Equal(t, 3, f.accepted(t), "no inbox row for a skipped tombstone")
	q, err := f.store.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Empty(t, q)
	require.Empty(t, f.broker.DeadLetters("erp"))
	results := map[string]string{}
	for _, s := range traces.Ended("process erp") {
		id, _ := telemetrytest.Attr(s, "messaging.message.id")
		result, _ := telemetrytest.Attr(s, "llmq.inbox.result")
		results[id.AsString()] = result.AsString()
		if strings.HasPrefix(id.AsString(), "op-") {
			require.Equal(t, s.SpanContext().SpanID(), spanIDs[id.AsString()], "%s handled in its own span", id.AsString())
		}
	}
	require.Equal(t, map[string]string{"op-1": "accepted", "op-2": "accepted", "op-3": "accepted", "tomb-1": "skipped", "": "skipped"}, results)
}
