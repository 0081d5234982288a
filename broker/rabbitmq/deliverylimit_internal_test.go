package rabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// RabbitMQ 4 gives quorum queues a delivery limit of 20 unless told
// otherwise; earlier releases and other brokers give none.
func TestDefaultDeliveryLimit(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]int{"3.10.8": 0, "3.13.7": 0, "4.0.2": 20, "4.3.0": 20, "10.1": 20, "": 0, "x.y": 0} {
		require.Equal(t, want, defaultDeliveryLimit(amqp.Table{"product": "RabbitMQ", "version": version}), version)
	}
	require.Zero(t, defaultDeliveryLimit(amqp.Table{"product": "LavinMQ", "version": "4.0.0"}))
	require.Zero(t, defaultDeliveryLimit(nil))
}

// The x-delivery-count header is read whatever its integer width; a
// negative or non-integer one is ignored.
func TestDeliveryCount(t *testing.T) {
	t.Parallel()
	for _, v := range []any{int64(3), int32(3), int16(3), int8(3), uint8(3), uint16(3), uint32(3)} {
		n, ok := deliveryCount(v)
		require.True(t, ok, "%T", v)
		require.Equal(t, int64(3), n)
	}
	for _, v := range []any{nil, "3", int64(-1), 3.0} {
		_, ok := deliveryCount(v)
		require.False(t, ok, "%T", v)
	}
}
