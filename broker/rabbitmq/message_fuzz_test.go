package rabbitmq

import (
	"maps"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
)

// A message the publisher accepts is received as it was sent: id, routing
// key, key, headers and body, which is never nil (AMQP has no null body).
func FuzzMessageRoundTrip(f *testing.F) {
	f.Add("ev-1", "orders.created", "order-7", "traceparent", "00-abc", []byte(`{"n":1}`))
	f.Add("ev-2", "t", "", "", "", []byte{})
	f.Add("ev-3", "t", "k", HeaderKey, "clash", []byte("x"))
	f.Add("", "t", "k", "h", "v", []byte("no id"))
	f.Add("ev-4", "t", "k", "x-death", "\x00\xff", []byte{0, 1, 2})
	f.Add("ev-5", "t", "", "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, id, topic, key, hk, hv string, body []byte) {
		msg := broker.Message{ID: id, Topic: topic, Key: key, Body: body}
		if hk != "" {
			msg.Headers = map[string]string{hk: hv}
		}
		pub, err := toPublishing(msg)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidMessage)
			return
		}
		require.NoError(t, pub.Headers.Validate())
		got := toMessage(amqp.Delivery{Headers: pub.Headers, MessageId: pub.MessageId, RoutingKey: topic, Body: pub.Body, DeliveryMode: pub.DeliveryMode})
		require.Equal(t, msg.ID, got.ID)
		require.Equal(t, msg.Topic, got.Topic)
		require.Equal(t, msg.Key, got.Key)
		require.Equal(t, string(msg.Body), string(got.Body))
		require.NotNil(t, got.Body)
		require.True(t, maps.Equal(msg.Headers, got.Headers), "headers %v became %v", msg.Headers, got.Headers)
		require.Equal(t, amqp.Persistent, pub.DeliveryMode)
	})
}
