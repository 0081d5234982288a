package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
)

// Every settled delivery is counted by its result: new messages accepted,
// redeliveries as duplicates, an id reused with another payload and a
// malformed message quarantined, a transient failure as failed.
func TestIngressCountsResults(t *testing.T) {
	t.Parallel()
	f := setupERP(t)
	m := telemetrytest.NewMetrics(t)
	c := f.broker.Consumer("erp")
	in, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: f.handler, MeterProvider: m.Provider})
	require.NoError(t, err)
	handle := func(msg broker.Message) {
		f.publish(t, msg)
		_ = in.Handle(t.Context(), receive(t, c))
	}
	handle(broker.Message{ID: "op-1", Topic: "erp", Body: []byte(`{"invoice":1}`)})
	handle(broker.Message{ID: "op-1", Topic: "erp", Body: []byte(`{"invoice":1}`)})
	handle(broker.Message{ID: "op-1", Topic: "erp", Body: []byte(`{"invoice":"changed"}`)})
	handle(broker.Message{ID: "op-bad", Topic: "erp", Body: []byte("not json")})
	f.fail.Store(1)
	handle(broker.Message{ID: "op-2", Topic: "erp", Body: []byte(`{"invoice":2}`)})

	// A batch, handled whole: two new messages and a duplicate.
	f.publish(t,
		broker.Message{ID: "op-3", Topic: "erp", Body: []byte(`{"invoice":3}`)},
		broker.Message{ID: "op-1", Topic: "erp", Body: []byte(`{"invoice":1}`)},
		broker.Message{ID: "op-4", Topic: "erp", Body: []byte(`{"invoice":4}`)},
	)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	// op-2's redelivery is accepted too.
	require.Eventually(t, func() bool { return f.ops(t) == 4 }, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	r := m.Collect(t)
	for result, want := range map[string]int64{"accepted": 4, "duplicate": 2, "quarantined": 2, "failed": 1} {
		got, _ := r.Int("llmq.inbox.messages", attribute.String("consumer", "erp"), attribute.String("result", result))
		require.Equal(t, want, got, result)
	}
}
