package invoice

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtest"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

// A finished upload's event becomes one webhook per subscribed endpoint,
// however often the relay publishes it, and every event still reaches the
// broker behind the publisher.
func TestUploadWebhookIsEnqueuedOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	var logs bytes.Buffer
	svc, err := New(db.Pool, Config{Schema: db.Schema, Auth: NewAuth(nil), AllowLoopback: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(ctx))
	for _, types := range [][]string{{BatchCompletedEvent}, {CompletedEvent}} { // the second is not told of uploads
		_, _, err := svc.Webhooks.RegisterEndpoint(ctx, db.Pool, webhook.EndpointParams{Tenant: "acme", URL: "http://127.0.0.1:1/hook", EventTypes: types})
		require.NoError(t, err)
	}
	res, err := svc.Jobs.EnqueueBatch(ctx, db.Pool, jobs.EnqueueBatchParams{Tenant: "acme", Key: "upload", Jobs: []jobs.EnqueueParams{
		{Kind: Kind, Queue: Queue, Payload: []byte(`{}`)}, {Kind: Kind, Queue: Queue, Payload: []byte(`{"n":2}`)},
	}})
	require.NoError(t, err)
	for _, j := range res.Jobs {
		_, err = svc.Jobs.Cancel(ctx, db.Pool, "acme", j.ID)
		require.NoError(t, err)
	}

	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	topic := svc.Jobs.Config().EventTopic
	consumer := mem.Consumer(topic)
	relay, err := svc.NewEventRelay(mem.Publisher(), outbox.RelayConfig{})
	require.NoError(t, err)
	_, err = relay.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, mem.Published(topic),
		"two acceptances, two cancels, the upload's end and the acceptance of its webhook's delivery job reach the broker")

	deliveries := func() (n int) {
		t.Helper()
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Schema+".webhook_deliveries WHERE event_type = $1",
			BatchCompletedEvent).Scan(&n))
		return n
	}
	require.Equal(t, 1, deliveries())

	// The same event published again (the relay publishes at least once)
	// adds no delivery.
	var done broker.Message
	for done.ID == "" {
		d, err := consumer.Receive(ctx)
		require.NoError(t, err)
		if d.Message().Headers[outbox.HeaderEventType] == jobs.BatchCompletedEvent {
			done = d.Message()
		}
		require.NoError(t, d.Ack(ctx))
	}
	require.NoError(t, svc.EventPublisher(nil).Publish(ctx, []broker.Message{done}))
	require.Equal(t, 1, deliveries())
	var raw []byte
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT body FROM "+db.Schema+".webhook_deliveries WHERE event_type = $1",
		BatchCompletedEvent).Scan(&raw))
	var body struct {
		Type string         `json:"type"`
		Data BatchDelivered `json:"data"`
	}
	require.NoError(t, json.Unmarshal(raw, &body))
	require.Equal(t, BatchCompletedEvent, body.Type)
	require.Equal(t, BatchDelivered{BatchID: res.Batch.ID, StatusURL: "/extraction-batches/" + res.Batch.ID.String(), Total: 2, Cancelled: 2}, body.Data)

	// An event that does not parse is logged and passed on, never retried
	// for ever.
	broken := done
	broken.Body = []byte(`{"batch_id":`)
	require.NoError(t, svc.EventPublisher(nil).Publish(ctx, []broker.Message{broken}))
	require.Contains(t, logs.String(), "does not parse")
	require.Equal(t, 1, deliveries())
}
