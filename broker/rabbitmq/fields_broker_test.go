package rabbitmq_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
)

// A plain amqp091 publisher sends a header of every AMQP field type, and a
// void llmq-key, through the broker: the consumer renders each as the
// package documentation says, which other clients can parse. (RabbitMQ
// refuses NaN and the infinities; TestFieldText covers them.)
func TestPlainAMQPFieldTypesRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	stamp := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	headers := amqp.Table{
		rabbitmq.HeaderKey: nil,
		"void":             nil,
		"bool":             true,
		"int8":             int8(-8),
		"uint8":            uint8(200),
		"int16":            int16(-16000),
		"uint16":           uint16(65000),
		"int32":            int32(-2000000000),
		"uint32":           uint32(4000000000),
		"int64":            int64(-9000000000000000000),
		"float32":          float32(1.5),
		"float64":          0.1,
		"string":           "eu-west",
		"bytes":            []byte("raw text"),
		"timestamp":        stamp,
		"decimal":          amqp.Decimal{Scale: 2, Value: 12345},
		"table": amqp.Table{
			"region": "eu", "n": int32(7), "none": nil, "at": stamp, "price": amqp.Decimal{Scale: 3, Value: -5},
			"blob": []byte{0xff, 0xfe}, "text": []byte("tag"), "ok": false, "ratio": 0.25,
		},
		"array": []any{int64(1), "two", nil, []any{uint16(3)}, amqp.Table{"k": "v"}},
	}
	withChannel(t, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		confirm, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), f.topo.Exchange, "orders.created", true, false, amqp.Publishing{
			MessageId: "typed-1", Headers: headers, DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
		})
		if err != nil {
			return err
		}
		require.True(t, confirm.Wait())
		return nil
	})

	m := receive(t, f.consumer(t, false)).Message()
	require.Equal(t, broker.Message{
		ID: "typed-1", Topic: "orders.created", Key: "", Body: []byte(`{}`),
		Headers: map[string]string{
			"void":      "",
			"bool":      "true",
			"int8":      "-8",
			"uint8":     "200",
			"int16":     "-16000",
			"uint16":    "65000",
			"int32":     "-2000000000",
			"uint32":    "4000000000",
			"int64":     "-9000000000000000000",
			"float32":   "1.5",
			"float64":   "0.1",
			"string":    "eu-west",
			"bytes":     "raw text",
			"timestamp": "2026-03-04T05:06:07Z",
			"decimal":   "123.45",
			"table":     `{"at":"2026-03-04T05:06:07Z","blob":"//4=","n":7,"none":null,"ok":false,"price":-0.005,"ratio":0.25,"region":"eu","text":"tag"}`,
			"array":     `[1,"two",null,[3],{"k":"v"}]`,
		},
	}, m)
}
