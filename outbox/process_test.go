package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/outbox"
)

// The test binary re-executes itself as a relay process for tests that
// must kill one.
const childEnv = "LLMQ_OUTBOX_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "relay" {
		os.Exit(runChildRelay())
	}
	goleak.VerifyTestMain(m)
}

func amqpURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return rabbitmq.DefaultURL
}

// Environment of a child relay.
const (
	envSchema   = "LLMQ_TEST_SCHEMA"
	envExchange = "LLMQ_TEST_EXCHANGE"
	envRelayID  = "LLMQ_TEST_RELAY_ID"
	envLease    = "LLMQ_TEST_LEADER_LEASE"
)

// childRelayConfig is the relay of every process in these tests: a long
// claim lease, so that a dead relay's claims outlast the test unless the
// takeover releases them.
func childRelayConfig(id string, lease time.Duration) outbox.RelayConfig {
	return outbox.RelayConfig{ID: id, LeaderLease: lease, ClaimLease: 10 * time.Minute, BatchSize: 20, PollInterval: 20 * time.Millisecond}
}

// slowPublisher confirms through the broker and then holds each batch a
// little, so that a relay is nearly always between a claim and its
// verdict: where a kill hurts most.
type slowPublisher struct {
	broker.Publisher
	hold time.Duration
}

func (p slowPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	err := p.Publisher.Publish(ctx, msgs)
	time.Sleep(p.hold) // widens the window the test kills in; not synchronisation
	return err
}

// runChildRelay is a relay process: it publishes to the test's exchange
// until it is killed.
func runChildRelay() int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	store, err := outbox.NewStore(outbox.Config{Schema: os.Getenv(envSchema)})
	if err != nil {
		return fail(err)
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: rabbitmq.ConnConfig{URL: amqpURL()}, Exchange: os.Getenv(envExchange)})
	if err != nil {
		return fail(err)
	}
	defer func() { _ = pub.Close() }()
	if err := pub.WaitConnected(ctx); err != nil {
		return fail(err)
	}
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		return fail(err)
	}
	r, err := store.NewRelay(pool, slowPublisher{Publisher: pub, hold: 20 * time.Millisecond}, childRelayConfig(os.Getenv(envRelayID), lease))
	if err != nil {
		return fail(err)
	}
	if err := r.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// rabbitFixture is a test's own exchange with one queue bound to "orders".
type rabbitFixture struct {
	exchange, queue string
}

func setupRabbit(t *testing.T) rabbitFixture {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	suffix := hex.EncodeToString(b[:])
	topo := rabbitmq.Topology{Exchange: "llmq.test.outbox.x." + suffix, Queues: []rabbitmq.Queue{{Name: "llmq.test.outbox." + suffix, Bindings: []string{"orders"}}}}
	withChannel := func(fn func(*amqp.Channel) error) {
		conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		require.NoError(t, err, "RabbitMQ at %s", amqpURL())
		defer func() { _ = conn.Close() }()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, fn(ch))
	}
	withChannel(topo.Declare)
	t.Cleanup(func() { withChannel(topo.Delete) })
	return rabbitFixture{exchange: topo.Exchange, queue: topo.Queues[0].Name}
}

// receiveAll consumes the queue until want distinct message ids arrived,
// and returns the deliveries in arrival order (duplicates included).
func (q rabbitFixture) receiveAll(t *testing.T, want int) []broker.Message {
	t.Helper()
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: rabbitmq.ConnConfig{URL: amqpURL()}, Queue: q.queue})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	seen := map[string]bool{}
	var got []broker.Message
	for len(seen) < want {
		d, err := c.Receive(ctx)
		require.NoError(t, err, "received %d of %d distinct messages", len(seen), want)
		got = append(got, d.Message())
		seen[d.Message().ID] = true
		require.NoError(t, d.Ack(ctx))
	}
	return got
}

// failoverRun is a failover test's setup: a writer writing total events on
// keys keys throughout, a child relay process that becomes active, and a
// successor relay standing by in this process.
type failoverRun struct {
	f          relayFixture
	mq         rabbitFixture
	total      int
	keys       int
	child      *exec.Cmd
	childLog   *telemetrytest.LogBuffer
	successor  *outbox.Relay
	writerDone chan struct{}
}

// failoverLease is the leader lease of the failover tests' relays: short,
// so takeovers come quickly, but long enough that the child relay keeps it
// until the test strikes while every package's tests load the machine (at
// 2 s its renewals, a third of the lease apart, timed out under make test
// and it stood down before it had published anything).
const failoverLease = 5 * time.Second

func startFailoverRun(t *testing.T, childID string, lease time.Duration) *failoverRun {
	t.Helper()
	run := &failoverRun{f: setupRelay(t), mq: setupRabbit(t), total: 1500, keys: 20, childLog: &telemetrytest.LogBuffer{}, writerDone: make(chan struct{})}
	f := run.f

	// One writer: write order is commit order.
	writeCtx, stopWriting := context.WithCancel(context.Background())
	go func() {
		defer close(run.writerDone)
		for i := range run.total {
			_, err := f.store.Write(writeCtx, f.db.Pool, outbox.Event{
				Topic: "orders", Key: fmt.Sprintf("key-%d", i%run.keys), Type: "order.changed",
				Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			})
			if err != nil {
				if writeCtx.Err() == nil {
					t.Error(err)
				}
				return
			}
			if i%50 == 49 {
				time.Sleep(5 * time.Millisecond) // pacing: keep writing through the fault
			}
		}
	}()
	t.Cleanup(func() { stopWriting(); <-run.writerDone })

	run.child = exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	run.child.Env = append(os.Environ(), childEnv+"=relay", envSchema+"="+f.db.Schema, envExchange+"="+run.mq.exchange,
		envRelayID+"="+childID, envLease+"="+lease.String(), "DATABASE_URL="+dbtest.URL())
	run.child.Stderr = io.MultiWriter(os.Stderr, run.childLog)
	require.NoError(t, run.child.Start())
	t.Cleanup(func() {
		_ = run.child.Process.Signal(syscall.SIGCONT)
		_ = run.child.Process.Kill()
		_ = run.child.Wait()
	})
	require.Eventually(t, func() bool { return run.holder(t) == childID }, 30*time.Second, 10*time.Millisecond, "the child relay became active")

	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: rabbitmq.ConnConfig{URL: amqpURL()}, Exchange: run.mq.exchange})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	run.successor, _ = f.runRelay(t, pub, childRelayConfig("successor", lease))

	// Strike mid-batch, once the child has published some and holds a
	// claim.
	require.Eventually(t, func() bool {
		published, held := run.counts(t, childID)
		return published >= 200 && held > 0
	}, 30*time.Second, time.Millisecond)
	return run
}

func (run *failoverRun) holder(t *testing.T) string {
	t.Helper()
	var holder *string
	require.NoError(t, run.f.db.Pool.QueryRow(t.Context(), "SELECT holder FROM "+run.f.db.Schema+".outbox_relay_lease").Scan(&holder))
	if holder == nil {
		return ""
	}
	return *holder
}

// counts returns the published events, and the unpublished ones claimed
// by relay id.
func (run *failoverRun) counts(t *testing.T, id string) (published, held int) {
	t.Helper()
	require.NoError(t, run.f.db.Pool.QueryRow(t.Context(),
		"SELECT count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FILTER (WHERE published_at IS NULL AND claimed_by = $1) FROM "+run.f.db.Schema+".outbox", id).
		Scan(&published, &held))
	return published, held
}

// finish waits until every event is written and published, then checks
// the broker got every one and the first delivery of each key's events
// came in write order.
func (run *failoverRun) finish(t *testing.T) {
	t.Helper()
	<-run.writerDone
	var written int
	require.NoError(t, run.f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+run.f.db.Schema+".outbox").Scan(&written))
	require.Equal(t, run.total, written)
	require.Eventually(t, func() bool { return run.f.pending(t) == 0 }, 60*time.Second, 10*time.Millisecond,
		"everything is published, the child relay's claims (10 minutes) included")

	got := run.mq.receiveAll(t, run.total)
	last := map[string]int{}
	first := map[string]bool{}
	for _, m := range got {
		if first[m.ID] {
			continue // a redelivery: at-least-once
		}
		first[m.ID] = true
		var body struct{ N int }
		require.NoError(t, json.Unmarshal(m.Body, &body))
		if prev, ok := last[m.Key]; ok {
			require.Greater(t, body.N, prev, "key %s out of order", m.Key)
		}
		last[m.Key] = body.N
	}
	require.Len(t, first, run.total)
	require.Len(t, last, run.keys)
}

// The active relay's process is killed (SIGKILL) while it publishes, with
// a batch claimed and unconfirmed and a writer still writing: a standby in
// another process takes over within twice the lease, publishes at once
// the events the dead relay held (their ten-minute claims are released at
// the takeover, not waited out), and every event reaches the broker, the
// first delivery of each key's events in write order.
func TestRelayFailoverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	const lease = failoverLease
	run := startFailoverRun(t, "doomed", lease)
	require.NoError(t, run.child.Process.Kill())
	killedAt := time.Now()
	_ = run.child.Wait()
	require.False(t, run.successor.Active())
	_, held := run.counts(t, "doomed")
	require.Positive(t, held, "the relay died holding claims")

	require.Eventually(t, run.successor.Active, 2*lease, 5*time.Millisecond, "a standby takes over within twice the lease")
	t.Logf("taken over %s after the kill", time.Since(killedAt).Round(time.Millisecond))
	run.finish(t)
}

// The active relay's process is frozen (SIGSTOP) while it publishes, for
// longer than its lease, and then resumes: a standby takes over within
// twice the lease meanwhile, and the resumed relay claims nothing more,
// marks nothing the successor publishes, and stands by; every event
// reaches the broker with each key's first deliveries in write order (the
// resumed relay's late copies of its old batch are duplicates).
func TestRelayPausedPastItsLeaseStandsDown(t *testing.T) {
	t.Parallel()
	const lease = failoverLease
	run := startFailoverRun(t, "paused", lease)
	require.NoError(t, run.child.Process.Signal(syscall.SIGSTOP))
	pausedAt := time.Now()

	require.Eventually(t, run.successor.Active, 2*lease, 5*time.Millisecond, "a standby takes over within twice the lease")
	t.Logf("taken over %s after the pause", time.Since(pausedAt).Round(time.Millisecond))
	publishedAtTakeover, _ := run.counts(t, "paused")
	require.Eventually(t, func() bool {
		published, _ := run.counts(t, "paused")
		return published >= publishedAtTakeover+200
	}, 30*time.Second, 10*time.Millisecond, "the successor publishes while the old relay is frozen")

	// Resumed, the relay stands by for either of two reasons, whichever it
	// meets first: its next renewal finds the successor holding the lease,
	// or the renewal it had in flight when frozen has run out of time.
	logged := len(run.childLog.String())
	require.NoError(t, run.child.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		since := run.childLog.String()[logged:]
		return strings.Contains(since, "lost the leader lease to another relay; standing by") ||
			strings.Contains(since, "could not renew the leader lease for a whole lease; standing by")
	}, 10*time.Second, 10*time.Millisecond, "the resumed relay stands by")
	run.finish(t)
	require.Equal(t, "successor", run.holder(t))
}
