package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
)

// cluster is the Kafka a test runs against: its own in-process kfake
// cluster, or the real one named by KAFKA_BROKERS, shared, where the test's
// topics and groups get unique names.
type cluster struct {
	brokers []string
	fake    *kfake.Cluster // nil on a real cluster
	adm     *kadm.Client
	prefix  string
	// sessionTimeout is the tests' group session: short on kfake (whose
	// minimum is lowered) yet long enough for a loaded machine; a real
	// broker's default minimum, 6s, elsewhere.
	sessionTimeout time.Duration
}

// target is a Kafka to run a test against: kfake, or the real cluster of
// KAFKA_BROKERS.
type target struct {
	name    string
	brokers string // empty for kfake
}

// targets lists kfake and the real cluster. A test runs one subtest per
// target, each calling target.setup, which skips the real one, saying why,
// when KAFKA_BROKERS is not set.
func targets() []target {
	return []target{{name: "kfake"}, {name: "real", brokers: os.Getenv("KAFKA_BROKERS")}}
}

func (tg target) setup(t *testing.T) *cluster {
	t.Helper()
	if tg.name == "real" && tg.brokers == "" {
		t.Skip("KAFKA_BROKERS is not set (comma-separated host:port): the real-cluster variant needs a Kafka cluster and none is configured; the kfake variant runs")
	}
	return setup(t, tg.brokers)
}

// setup returns a cluster: kfake when brokers is empty.
func setup(t testing.TB, brokers string) *cluster {
	t.Helper()
	c := &cluster{prefix: "llmq-test-" + suffix()}
	if brokers == "" {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(200*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(fake.Close)
		c.fake, c.brokers, c.sessionTimeout = fake, fake.ListenAddrs(), 2*time.Second
	} else {
		c.brokers, c.sessionTimeout = strings.Split(brokers, ","), 6*time.Second
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	c.adm = kadm.NewClient(cl)
	return c
}

func suffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// topic creates a topic with a unique name and its dead-letter topic.
func (c *cluster) topic(t testing.TB, name string, partitions int32) string {
	t.Helper()
	topic := c.prefix + "-" + name
	resps, err := c.adm.CreateTopics(t.Context(), partitions, 1, nil, topic, topic+".dlq")
	require.NoError(t, err)
	for _, r := range resps {
		require.NoError(t, r.Err, "creating %s", r.Topic)
	}
	return topic
}

func (c *cluster) group(name string) string { return c.prefix + "-" + name }

func (c *cluster) publisher(t testing.TB, cfg kafka.PublisherConfig) *kafka.Publisher {
	t.Helper()
	cfg.Brokers = c.brokers
	p, err := kafka.NewPublisher(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (c *cluster) consumer(t *testing.T, cfg kafka.ConsumerConfig) *kafka.Consumer {
	t.Helper()
	cfg.Brokers = c.brokers
	cfg.SessionTimeout = cmpOr(cfg.SessionTimeout, c.sessionTimeout)
	cfg.Options = append(cfg.Options, kgo.HeartbeatInterval(cfg.SessionTimeout/10)) // quick rebalances
	k, err := kafka.NewConsumer(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Close() })
	return k
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// publish produces n messages to topic, keyed k0..k(keys-1) in turn.
func (c *cluster) publish(t *testing.T, topic string, n, keys int) []broker.Message {
	t.Helper()
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{
			ID: fmt.Sprintf("m-%05d", i), Topic: topic, Key: fmt.Sprintf("k%d", i%keys),
			Body: fmt.Appendf(nil, `{"n":%d}`, i),
		}
	}
	require.NoError(t, c.publisher(t, kafka.PublisherConfig{}).Publish(t.Context(), msgs))
	return msgs
}

// committed reads the group's committed offsets of topic by partition.
func (c *cluster) committed(ctx context.Context, group, topic string) (map[int32]int64, error) {
	resps, err := c.adm.FetchOffsetsForTopics(ctx, group, topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for p, r := range resps[topic] {
		if r.Err != nil {
			return nil, r.Err
		}
		out[p] = max(r.At, 0)
	}
	return out, nil
}

// ends reads topic's end offsets by partition.
func (c *cluster) ends(t *testing.T, topic string) map[int32]int64 {
	t.Helper()
	listed, err := c.adm.ListEndOffsets(t.Context(), topic)
	require.NoError(t, err)
	out := map[int32]int64{}
	for p, o := range listed[topic] {
		require.NoError(t, o.Err)
		out[p] = o.Offset
	}
	return out
}

func receive(t *testing.T, c broker.Consumer) broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d, err := c.Receive(ctx)
	require.NoError(t, err)
	return d
}
