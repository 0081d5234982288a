package kafka

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrInvalidConfig is wrapped by NewPublisher and NewConsumer when their
// configuration is unusable; the message names the field.
var ErrInvalidConfig = errors.New("kafka: invalid config")

// ErrInvalidMessage fails, in a *broker.PublishError, a message Publish
// refuses before producing it: one without an ID or a Topic.
var ErrInvalidMessage = errors.New("kafka: invalid message")

// ErrEarlierFailed fails, in a *broker.PublishError, a message that was not
// produced because an earlier message of the same Publish call with the
// same Key failed: producing it would put it ahead of that one.
var ErrEarlierFailed = errors.New("an earlier message with the same key failed")

// ErrRevoked is returned by a delivery's Ack, Nack or Reject after its
// partition was revoked from (or lost by) this consumer. Its record is not
// settled here: the partition's new owner receives it again from the last
// committed offset.
var ErrRevoked = errors.New("kafka: partition revoked; the record will be delivered to its new owner")

// ErrAlreadySettled is returned by Ack, Nack or Reject on a delivery that
// already had its verdict: the contract allows exactly one.
var ErrAlreadySettled = errors.New("kafka: delivery already settled")

// PublisherConfig configures a Publisher. Zero values mean the documented
// defaults.
type PublisherConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// DeliveryTimeout bounds how long a record may wait, across retries,
	// for the brokers' acknowledgement before it fails
	// (kgo.RecordDeliveryTimeout, Kafka's delivery.timeout.ms). Default 30s.
	DeliveryTimeout time.Duration
	// RequestTimeout bounds one produce request at the broker
	// (kgo.ProduceRequestTimeout). Default 10s.
	RequestTimeout time.Duration
	// RecordRetries, if positive, fails a record after that many failed
	// produce attempts instead of retrying until DeliveryTimeout
	// (kgo.RecordRetries).
	RecordRetries int
	// Linger is how long a partition's batch waits for more records
	// (kgo.ProducerLinger). Default 0: Publish waits for confirmations,
	// so there is nothing to gain by waiting for more records first.
	Linger time.Duration
	// Options are appended to the client's options: TLS, SASL, a logger,
	// a client id, kgo.MetadataMinAge (a retry after a leadership error
	// waits for a metadata refresh, at most one per MetadataMinAge, 5s by
	// default). Options that would undo the publisher's guarantees (acks,
	// idempotence) are the caller's responsibility.
	Options []kgo.Opt
}

func (cfg PublisherConfig) withDefaults() (PublisherConfig, error) {
	if len(cfg.Brokers) == 0 {
		return cfg, fmt.Errorf("%w: PublisherConfig.Brokers is empty; name at least one seed broker", ErrInvalidConfig)
	}
	if err := nonNegative(map[string]time.Duration{
		"PublisherConfig.DeliveryTimeout": cfg.DeliveryTimeout,
		"PublisherConfig.RequestTimeout":  cfg.RequestTimeout,
		"PublisherConfig.Linger":          cfg.Linger,
	}); err != nil {
		return cfg, err
	}
	if cfg.RecordRetries < 0 {
		return cfg, fmt.Errorf("%w: PublisherConfig.RecordRetries is %d; use 0 to retry until DeliveryTimeout", ErrInvalidConfig, cfg.RecordRetries)
	}
	cfg.DeliveryTimeout = cmp.Or(cfg.DeliveryTimeout, 30*time.Second)
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, 10*time.Second)
	return cfg, nil
}

// producerOpts are the options that make a client's produce path keep the
// publisher's guarantees.
func (cfg PublisherConfig) producerOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		// Every in-sync replica has the record before it is confirmed;
		// idempotence (kgo's default, never disabled here) keeps retries
		// from duplicating or reordering records within a partition.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.ProduceRequestTimeout(cfg.RequestTimeout),
		kgo.ProducerLinger(cfg.Linger),
	}
	if cfg.RecordRetries > 0 {
		opts = append(opts, kgo.RecordRetries(cfg.RecordRetries))
	}
	return opts
}

// ConsumerConfig configures a Consumer. Zero values mean the documented
// defaults.
type ConsumerConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Group is the consumer group. Required.
	Group string
	// Topics are consumed. Required.
	Topics []string
	// MaxInFlight bounds, per partition, the records fetched but not yet
	// committable: waiting for Receive, delivered and unsettled, or
	// settled behind one that is not. A partition reaching it is paused
	// (its fetching stops while the client keeps polling and
	// heartbeating) and resumed once it is down to half. A poll takes at
	// most MaxInFlight records (and at most 500), so a partition holds
	// fewer than twice MaxInFlight. It also bounds what a crash redelivers
	// per partition. Default 256.
	MaxInFlight int
	// CommitInterval is how often the committable prefix of each partition
	// is committed. Commits also happen on revocation and Close. Default 1s.
	CommitInterval time.Duration
	// NackDelay is how long a Nacked record waits before this consumer
	// delivers it again. Default 1s.
	NackDelay time.Duration
	// DeadLetterTopic receives rejected records. Default: the record's
	// topic with ".dlq" appended. The topic must exist unless the cluster
	// creates topics on demand.
	DeadLetterTopic string
	// SessionTimeout and RebalanceTimeout are the group's
	// (kgo.SessionTimeout, kgo.RebalanceTimeout). Defaults 45s and 60s.
	SessionTimeout, RebalanceTimeout time.Duration
	// CommitTimeout bounds one offset commit. Default 10s.
	CommitTimeout time.Duration
	// Publisher configures the produce path of dead-lettering; its
	// Brokers and Options are taken from this config.
	Publisher PublisherConfig
	// ReadUncommitted makes the consumer read records of open and aborted
	// transactions too (isolation level read_uncommitted, kgo's default).
	// By default it reads with read_committed: a producer's aborted
	// transaction is never delivered, and a partition is read only up to
	// its last stable offset, so records behind an open transaction wait
	// for it to end.
	ReadUncommitted bool
	// Logger receives warnings: failed fetches and commits. Default
	// slog.Default(), so that they are seen without configuration.
	Logger *slog.Logger
	// Options are appended to the client's options: TLS, SASL, a logger,
	// a client id, a balancer.
	Options []kgo.Opt
}

func (cfg ConsumerConfig) withDefaults() (ConsumerConfig, error) {
	switch {
	case len(cfg.Brokers) == 0:
		return cfg, fmt.Errorf("%w: ConsumerConfig.Brokers is empty; name at least one seed broker", ErrInvalidConfig)
	case cfg.Group == "":
		return cfg, fmt.Errorf("%w: ConsumerConfig.Group is required", ErrInvalidConfig)
	case len(cfg.Topics) == 0:
		return cfg, fmt.Errorf("%w: ConsumerConfig.Topics is empty", ErrInvalidConfig)
	case cfg.MaxInFlight < 0:
		return cfg, fmt.Errorf("%w: ConsumerConfig.MaxInFlight is %d; use 0 for the default or a positive bound", ErrInvalidConfig, cfg.MaxInFlight)
	}
	for i, t := range cfg.Topics {
		if t == "" {
			return cfg, fmt.Errorf("%w: ConsumerConfig.Topics[%d] is empty", ErrInvalidConfig, i)
		}
	}
	if err := nonNegative(map[string]time.Duration{
		"ConsumerConfig.CommitInterval":   cfg.CommitInterval,
		"ConsumerConfig.NackDelay":        cfg.NackDelay,
		"ConsumerConfig.SessionTimeout":   cfg.SessionTimeout,
		"ConsumerConfig.RebalanceTimeout": cfg.RebalanceTimeout,
		"ConsumerConfig.CommitTimeout":    cfg.CommitTimeout,
	}); err != nil {
		return cfg, err
	}
	cfg.Publisher.Brokers, cfg.Publisher.Options = cfg.Brokers, nil
	pub, err := cfg.Publisher.withDefaults()
	if err != nil {
		return cfg, err
	}
	cfg.Publisher = pub
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 256)
	cfg.CommitInterval = cmp.Or(cfg.CommitInterval, time.Second)
	cfg.NackDelay = cmp.Or(cfg.NackDelay, time.Second)
	cfg.CommitTimeout = cmp.Or(cfg.CommitTimeout, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}

func nonNegative(durations map[string]time.Duration) error {
	for name, d := range durations {
		if d < 0 {
			return fmt.Errorf("%w: %s is %s; use 0 for the default or a positive duration", ErrInvalidConfig, name, d)
		}
	}
	return nil
}
