package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/kafka"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/examples/internal/sqlfile"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// childEnv carries a child process's configuration (JSON) from the
// controller; roleEnv names its role when the test binary is the child.
const (
	childEnv = "LLMQ_CHAOS_CHILD"
	roleEnv  = "LLMQ_CHAOS_ROLE"
)

// The child roles.
const (
	roleWorker  = "worker"
	roleSignals = "signals"
)

// The brokers the signal path runs on; "postgres" runs it on the in-process
// memory broker of the signals process, leaving Postgres as the only shared
// component.
const (
	brokerPostgres = "postgres"
	brokerRabbitMQ = "rabbitmq"
	brokerKafka    = "kafka"
)

// signalConsumer is the inbox consumer name of the signal path.
const signalConsumer = "chaos-signals"

// webhookSchedule is short, so an ERP outage of seconds spans several
// retry steps and is ridden out in seconds; production keeps
// webhook.DefaultSchedule().
func webhookSchedule() []time.Duration {
	return []time.Duration{
		0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second, 2 * time.Second, 2 * time.Second,
		3 * time.Second, 3 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second,
	}
}

// childConfig is what the controller tells a child process.
type childConfig struct {
	Role        string  `json:"role"`
	DatabaseURL string  `json:"database_url"` // carries the child's application_name
	Schema      string  `json:"schema"`
	WorkerID    string  `json:"worker_id,omitempty"`
	ProviderURL string  `json:"provider_url,omitempty"`
	APIKey      string  `json:"api_key,omitempty"`
	Pool        string  `json:"pool,omitempty"`
	RPM         int     `json:"rpm,omitempty"`
	TPM         int64   `json:"tpm,omitempty"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	Workers     int     `json:"workers,omitempty"`
	Broker      string  `json:"broker,omitempty"`
	BrokerAddr  string  `json:"broker_addr,omitempty"` // AMQP URL or Kafka host:port
	Exchange    string  `json:"exchange,omitempty"`
	Queue       string  `json:"queue,omitempty"`
	Group       string  `json:"group,omitempty"`
	Scale       float64 `json:"scale,omitempty"`

	// FallbackURL, FallbackPool and FallbackModel are the extraction
	// route's second candidate (invoice.Fallback), with the pool's limits.
	FallbackURL   string `json:"fallback_url,omitempty"`
	FallbackPool  string `json:"fallback_pool,omitempty"`
	FallbackModel string `json:"fallback_model,omitempty"`
}

// withAppName returns databaseURL with application_name set, so the
// controller can find the process's backends in pg_stat_activity.
func withAppName(databaseURL, name string, maxConns int) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	q := u.Query()
	q.Set("application_name", name)
	if maxConns > 0 {
		q.Set("pool_max_conns", strconv.Itoa(maxConns))
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// runChild runs the role a child process was started for, configured by
// the JSON in childEnv, until ctx ends or stdin does: the controller holds
// its other end, so a child never outlives the run, however the controller
// ended.
func runChild(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) error {
	var cc childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cc); err != nil {
		return fmt.Errorf("%s: %w", childEnv, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var armed atomic.Bool
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			if sc.Text() == "arm" {
				armed.Store(true)
			}
		}
		cancel()
	}()
	var err error
	switch cc.Role {
	case roleWorker:
		err = runWorker(ctx, cc, stdout, stderr)
	case roleSignals:
		err = runSignals(ctx, cc, &armed, stdout, stderr)
	default:
		return fmt.Errorf("unknown role %q", cc.Role)
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil // told to stop
	}
	return err
}

// openService connects and builds the invoice service as the invoice
// command does: migrate llmq's tables and the service's, then the stores.
func openService(ctx context.Context, cc childConfig) (*pgxpool.Pool, *invoice.Service, error) {
	pool, err := pgxpool.New(ctx, cc.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	svc, err := func() (*invoice.Service, error) {
		if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: cc.Schema}); err != nil {
			return nil, err
		}
		svc, err := invoice.New(pool, invoice.Config{
			Schema: cc.Schema, Auth: invoice.NewAuth(nil), AllowLoopback: true, WebhookSchedule: webhookSchedule(),
		})
		if err != nil {
			return nil, err
		}
		err = svc.Migrate(ctx)
		return svc, err
	}()
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, svc, nil
}

// runWorker is the invoice command's worker mode with the chaos run's
// settings: the extraction runner under the shared admission pool, and the
// webhook deliveries to the ERP.
func runWorker(ctx context.Context, cc childConfig, stdout, stderr io.Writer) error {
	pool, svc, err := openService(ctx, cc)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runner, err := svc.NewRunner(ctx, invoice.WorkerConfig{
		ProviderURL: cc.ProviderURL, APIKey: cc.APIKey, Pool: cc.Pool, WorkerID: cc.WorkerID, Workers: cc.Workers,
		Limits:          admission.Pool{RPM: cc.RPM, TPM: cc.TPM, MaxInFlight: cc.MaxInFlight},
		AttemptTimeout:  2 * time.Second,
		Retry:           llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second},
		WebhookTimeout:  time.Second,
		BreakerCooldown: 500 * time.Millisecond,
		PollInterval:    100 * time.Millisecond,
		ShutdownGrace:   2 * time.Second,
		Logger:          logger,
		// The route's second candidate: the same provider in
		// Anthropic's dialect, under a pool of its own.
		Fallback: &invoice.Fallback{
			ProviderURL: cc.FallbackURL, APIKey: cc.APIKey, Pool: cc.FallbackPool, Model: cc.FallbackModel,
			Limits: admission.Pool{RPM: cc.RPM, TPM: cc.TPM, MaxInFlight: cc.MaxInFlight},
		},
	})
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintln(stdout, "ready")
	return runner.Run(ctx)
}

// runSignals runs the signal path: the outbox relay publishing the job
// store's events to the broker, and the inbox ingress accepting them into
// chaos_signals. It prints "recv <id>" for every delivery it takes and,
// once armed ("arm" on stdin), holds the next delivery whose transaction
// committed instead of acknowledging it, printing "held <id>": the
// controller then kills the process (RabbitMQ, Kafka), or the process
// closes its consumer and opens another (the memory broker, which lives
// and dies with the process).
func runSignals(ctx context.Context, cc childConfig, armed *atomic.Bool, stdout, stderr io.Writer) error {
	pool, svc, err := openService(ctx, cc)
	if err != nil {
		return err
	}
	defer pool.Close()
	q, err := sqlfile.Load(cc.Schema, queriesSQL)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	topic := svc.Jobs.Config().EventTopic
	b, err := openBroker(cc, topic, logger) //nolint:contextcheck // the adapters' constructors take no context
	if err != nil {
		return err
	}
	defer b.close()
	relay, err := svc.Outbox.NewRelay(pool, b.pub, outbox.RelayConfig{
		PollInterval: 100 * time.Millisecond, ClaimLease: 2 * time.Second,
		Backoff: llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second}, Logger: logger,
	})
	if err != nil {
		return err
	}
	in, err := inbox.NewStore(inbox.Config{Schema: cc.Schema})
	if err != nil {
		return err
	}
	out := &lines{w: stdout}
	out.printf("ready")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	record := q.Must("RecordSignal")
	for ctx.Err() == nil {
		cons, err := b.consumer()
		if err != nil {
			return err
		}
		rec := &recorder{Consumer: cons, out: out, armed: armed, hold: b.kind != brokerPostgres, handled: map[string]bool{}}
		ingress, err := in.NewIngress(pool, rec, inbox.IngressConfig{
			Consumer: signalConsumer, Logger: logger,
			Handler: func(ctx context.Context, tx pgx.Tx, msg broker.Message) error {
				rec.markHandled(msg.ID)
				_, err := tx.Exec(ctx, record, msg.ID)
				return err
			},
		})
		if err != nil {
			_ = cons.Close()
			return err
		}
		err = ingress.Run(ctx)
		_ = cons.Close()
		if ctx.Err() != nil || !rec.reopen.Load() {
			cancel()
			return errors.Join(err, <-relayDone)
		}
	}
	return <-relayDone
}

// lines writes whole lines to the controller, one write each.
type lines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lines) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintf(l.w, format+"\n", args...)
}

// recorder is the ingress's consumer: it reports every delivery, each one
// acknowledged without its handler having run ("dup <id>": the inbox took
// it as a duplicate), and holds the armed one.
type recorder struct {
	broker.Consumer
	out    *lines
	armed  *atomic.Bool
	hold   bool // block in Ack until killed; false: close and reopen
	reopen atomic.Bool

	mu      sync.Mutex
	handled map[string]bool // ids whose handler ran for their current delivery
}

func (r *recorder) markHandled(id string) {
	r.mu.Lock()
	r.handled[id] = true
	r.mu.Unlock()
}

// settled forgets id's delivery and says whether its handler ran.
func (r *recorder) settled(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ran := r.handled[id]
	delete(r.handled, id)
	return ran
}

func (r *recorder) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := r.Consumer.Receive(ctx)
	if err != nil {
		return nil, err
	}
	r.out.printf("recv %s", d.Message().ID)
	return &heldDelivery{Delivery: d, r: r}, nil
}

type heldDelivery struct {
	broker.Delivery
	r *recorder
}

// Ack runs after the ingress committed the message's transaction: the
// window in which a consumer that stops leaves a committed message
// unacknowledged, to be redelivered.
func (d *heldDelivery) Ack(ctx context.Context) error {
	ran := d.r.settled(d.Message().ID)
	if !ran {
		d.r.out.printf("dup %s", d.Message().ID)
	}
	if !ran || !d.r.armed.CompareAndSwap(true, false) {
		return d.Delivery.Ack(ctx)
	}
	d.r.out.printf("held %s", d.Message().ID)
	if d.r.hold {
		<-ctx.Done() // the controller kills the process here
		return ctx.Err()
	}
	d.r.reopen.Store(true)
	go func() { _ = d.r.Close() }()
	return broker.ErrClosed
}

func (d *heldDelivery) Nack(ctx context.Context) error {
	d.r.settled(d.Message().ID)
	return d.Delivery.Nack(ctx)
}

func (d *heldDelivery) Reject(ctx context.Context, reason error) error {
	d.r.settled(d.Message().ID)
	return d.Delivery.Reject(ctx, reason)
}

// signalBroker is the signal path's broker as one process sees it.
type signalBroker struct {
	kind     string
	pub      broker.Publisher
	consumer func() (broker.Consumer, error)
	close    func()
}

func openBroker(cc childConfig, topic string, logger *slog.Logger) (*signalBroker, error) {
	switch cc.Broker {
	case brokerPostgres:
		mem := memory.New(memory.Config{})
		return &signalBroker{
			kind: cc.Broker, pub: mem.Publisher(),
			consumer: func() (broker.Consumer, error) { return mem.Consumer(topic), nil },
			close:    func() { _ = mem.Close() },
		}, nil
	case brokerRabbitMQ:
		conn := rabbitmq.ConnConfig{
			URL: cc.BrokerAddr, Heartbeat: time.Second, DialTimeout: time.Second,
			Reconnect: llmqtype.BackoffPolicy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond}, Logger: logger,
		}
		conn.Name = "llmq-chaos-relay"
		pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: conn, Exchange: cc.Exchange, PublishTimeout: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		conn.Name = "llmq-chaos-ingress"
		return &signalBroker{
			kind: cc.Broker, pub: pub,
			consumer: func() (broker.Consumer, error) {
				return rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: conn, Queue: cc.Queue, RequeueDelay: 100 * time.Millisecond})
			},
			close: func() { _ = pub.Close() },
		}, nil
	case brokerKafka:
		brokers := strings.Split(cc.BrokerAddr, ",")
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, DeliveryTimeout: 10 * time.Second, RequestTimeout: 2 * time.Second})
		if err != nil {
			return nil, err
		}
		return &signalBroker{
			kind: cc.Broker, pub: pub,
			consumer: func() (broker.Consumer, error) {
				return kafka.NewConsumer(kafka.ConsumerConfig{
					Brokers: brokers, Group: cc.Group, Topics: []string{topic},
					CommitInterval: 200 * time.Millisecond, NackDelay: 100 * time.Millisecond,
					SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second, Logger: logger,
					Options: []kgo.Opt{kgo.HeartbeatInterval(300 * time.Millisecond)},
				})
			},
			close: func() { _ = pub.Close() },
		}, nil
	}
	return nil, fmt.Errorf("broker %q: postgres, rabbitmq or kafka", cc.Broker)
}
