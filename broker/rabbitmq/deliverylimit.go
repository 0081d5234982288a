package rabbitmq

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/validate"
)

// Delivery limits: see ConsumerConfig.DeliveryLimit.
const (
	// NoDeliveryLimit is a ConsumerConfig.DeliveryLimit saying the queue
	// has none.
	NoDeliveryLimit = -1
	// MaxDeliveryLimit bounds ConsumerConfig.DeliveryLimit.
	MaxDeliveryLimit = math.MaxInt32
	// rabbitMQ4DeliveryLimit is the limit RabbitMQ 4 gives a quorum queue
	// that sets none.
	rabbitMQ4DeliveryLimit = 20
)

// deliveryLimit validates cfg's DeliveryLimit and returns it, or its
// topology's for its queue when it is 0 (still 0 if the topology sets
// none, for the broker's default).
func deliveryLimit(cfg ConsumerConfig) (int, error) {
	if cfg.DeliveryLimit < NoDeliveryLimit || cfg.DeliveryLimit > MaxDeliveryLimit {
		return 0, &validate.Error{Kind: ErrInvalidConfig, Field: "DeliveryLimit",
			Problem: fmt.Sprintf("is %d; use 0 for the topology's or the broker's default, -1 (NoDeliveryLimit) for none, or 1 to %d", cfg.DeliveryLimit, MaxDeliveryLimit)}
	}
	if cfg.Topology == nil {
		return cfg.DeliveryLimit, nil
	}
	for _, q := range cfg.Topology.Queues {
		switch {
		case q.Name != cfg.Queue || q.DeliveryLimit == 0:
		case cfg.DeliveryLimit == 0:
			return q.DeliveryLimit, nil
		case cfg.DeliveryLimit != q.DeliveryLimit:
			return 0, &validate.Error{Kind: ErrInvalidConfig, Field: "DeliveryLimit",
				Problem: fmt.Sprintf("is %d, but Topology declares queue %s with DeliveryLimit %d; they must agree", cfg.DeliveryLimit, q.Name, q.DeliveryLimit)}
		}
	}
	return cfg.DeliveryLimit, nil
}

// deliveryLimitOn is the queue's delivery limit on conn's broker: the
// configured one, or the broker's default. 0 means none.
func (c *Consumer) deliveryLimitOn(conn *amqp.Connection) int {
	switch limit := c.cfg.DeliveryLimit; {
	case limit == NoDeliveryLimit:
		return 0
	case limit > 0:
		return limit
	}
	return defaultDeliveryLimit(conn.Properties)
}

// defaultDeliveryLimit is the delivery limit a broker with these server
// properties gives a quorum queue that sets none: 20 from RabbitMQ 4.0
// on, none before (nor on brokers that are not RabbitMQ).
func defaultDeliveryLimit(server amqp.Table) int {
	if product, _ := server["product"].(string); product != "RabbitMQ" {
		return 0
	}
	version, _ := server["version"].(string)
	major, _, _ := strings.Cut(version, ".")
	if n, err := strconv.Atoi(major); err == nil && n >= 4 {
		return rabbitMQ4DeliveryLimit
	}
	return 0
}

// DeliveryAttempt returns which delivery of the message this is, and the
// most the queue makes: one more than its delivery limit (see
// ConsumerConfig.DeliveryLimit), or 0 without one. The attempt is one
// more than the x-delivery-count header, which quorum queues set on each
// redelivery: the count of failed deliveries the queue's limit applies
// to. RabbitMQ 3 counts every return (a nack, a channel closed before a
// verdict); later releases may leave some out, and their limit with them.
// Without the header (a first delivery, or a classic queue, which counts
// nothing) the attempt is 1.
func (d *Delivery) DeliveryAttempt() (attempt, limit int) {
	attempt = 1
	if n, ok := deliveryCount(d.raw.Headers["x-delivery-count"]); ok && n < MaxDeliveryLimit {
		attempt = int(n) + 1
	}
	if d.sess.deliveryLimit > 0 {
		limit = d.sess.deliveryLimit + 1
	}
	return attempt, limit
}

// lastAttempt reports whether handing the message back would end it.
func (d *Delivery) lastAttempt() bool {
	attempt, limit := d.DeliveryAttempt()
	return limit > 0 && attempt >= limit
}

// deliveryCount reads the x-delivery-count header, an integer of whatever
// width the broker chose.
func deliveryCount(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, v >= 0
	case int32:
		return int64(v), v >= 0
	case int16:
		return int64(v), v >= 0
	case int8:
		return int64(v), v >= 0
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}
