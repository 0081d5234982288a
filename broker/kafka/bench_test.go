package kafka_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// BenchmarkPublish measures Publish on kfake in calls of 1,000 messages:
// with as many keys as messages (all produced at once) and with ten keys
// (each key's messages one acknowledged produce after another).
func BenchmarkPublish(b *testing.B) {
	for _, keys := range []int{1000, 10} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			c := setup(b, "")
			topic := c.topic(b, "bench", 6)
			pub := c.publisher(b, kafka.PublisherConfig{})
			msgs := make([]broker.Message, 1000)
			for i := range msgs {
				msgs[i] = broker.Message{ID: fmt.Sprintf("evt-%d", i), Topic: topic, Key: fmt.Sprintf("k%d", i%keys), Body: []byte(`{"n":1}`)}
			}
			for b.Loop() {
				require.NoError(b, pub.Publish(b.Context(), msgs))
			}
			b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
