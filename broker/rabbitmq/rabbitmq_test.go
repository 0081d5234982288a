package rabbitmq_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/rabbitmq"
)

func amqpURL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return rabbitmq.DefaultURL
}

// fixture is one test's own exchange and quorum queue (with its
// dead-letter exchange and queue), deleted when the test ends.
type fixture struct {
	topo  rabbitmq.Topology
	queue rabbitmq.Queue
	proxy *proxy
}

func setup(t testing.TB, q ...rabbitmq.Queue) *fixture {
	t.Helper()
	suffix := randomSuffix(t)
	queue := rabbitmq.Queue{Name: "llmq.test." + suffix, Bindings: []string{"orders.#"}}
	if len(q) > 0 {
		queue = q[0]
		queue.Name = "llmq.test." + suffix
	}
	f := &fixture{
		topo:  rabbitmq.Topology{Exchange: "llmq.test.x." + suffix, Queues: []rabbitmq.Queue{queue}},
		queue: queue,
		proxy: newProxy(t),
	}
	withChannel(t, func(ch *amqp.Channel) error { return f.topo.Declare(ch) })
	t.Cleanup(func() {
		withChannel(t, func(ch *amqp.Channel) error { return f.topo.Delete(ch) })
	})
	return f
}

// withChannel runs fn on a channel of a connection of its own.
func withChannel(t testing.TB, fn func(*amqp.Channel) error) {
	t.Helper()
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, fn(ch))
}

func randomSuffix(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

func (f *fixture) conn(t testing.TB, viaProxy bool) rabbitmq.ConnConfig {
	t.Helper()
	url := amqpURL()
	if viaProxy {
		url = f.proxy.url(t)
	}
	return rabbitmq.ConnConfig{
		URL:       url,
		Name:      t.Name(),
		Heartbeat: time.Second,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
}

func (f *fixture) publisher(t testing.TB, viaProxy bool) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: f.conn(t, viaProxy), Exchange: f.topo.Exchange, Window: 256})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.WaitConnected(ctx))
	return p
}

func (f *fixture) consumer(t *testing.T, viaProxy bool) *rabbitmq.Consumer {
	t.Helper()
	c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: f.conn(t, viaProxy), Queue: f.queue.Name, Prefetch: 512, RequeueDelay: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.WaitConnected(ctx))
	return c
}

func receive(t *testing.T, c broker.Consumer) broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := c.Receive(ctx)
	require.NoError(t, err)
	return d
}

// getDeadLetter takes one message from the queue's dead-letter queue.
func (f *fixture) getDeadLetter(t *testing.T) (amqp.Delivery, bool) {
	t.Helper()
	_, dlq := f.queue.DeadLetterNames()
	var (
		d  amqp.Delivery
		ok bool
	)
	withChannel(t, func(ch *amqp.Channel) error {
		var err error
		d, ok, err = ch.Get(dlq, true)
		return err
	})
	return d, ok
}

func msg(i int) broker.Message {
	return broker.Message{
		ID: "ev-" + strconv.Itoa(i), Topic: "orders.created", Key: "order-" + strconv.Itoa(i%7),
		Headers: map[string]string{"traceparent": "00-trace-" + strconv.Itoa(i)},
		Body:    []byte(`{"n":` + strconv.Itoa(i) + `}`),
	}
}

// proxy is a TCP proxy to the broker that the test can cut: Sever drops
// every connection through it, and while down it refuses new ones. It
// forwards the broker's side frame by frame, so that Inject can slip a
// frame of the broker's protocol in between. Only this test's connections
// pass through it.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	down    bool
	conns   map[net.Conn]struct{}
	clients map[net.Conn]*sync.Mutex // guards writes to each client
}

func newProxy(t testing.TB) *proxy {
	t.Helper()
	uri, err := amqp.ParseURI(amqpURL())
	require.NoError(t, err)
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)), conns: map[net.Conn]struct{}{}, clients: map[net.Conn]*sync.Mutex{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.serve()
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		p.Sever()
	})
	return p
}

func (p *proxy) url(t testing.TB) string {
	t.Helper()
	uri, err := amqp.ParseURI(amqpURL())
	require.NoError(t, err)
	addr, ok := p.ln.Addr().(*net.TCPAddr)
	require.True(t, ok)
	uri.Host, uri.Port = "127.0.0.1", addr.Port
	return uri.String()
}

func (p *proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = client.Close()
			continue
		}
		server, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		writeMu := &sync.Mutex{}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.clients[client] = writeMu
		p.mu.Unlock()
		pipe := func(dst, src net.Conn, copyFn func() error) {
			_ = copyFn()
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			delete(p.clients, client)
			p.mu.Unlock()
		}
		go pipe(server, client, func() error { _, err := io.Copy(server, client); return err })
		go pipe(client, server, func() error { return copyFrames(client, server, writeMu) })
	}
}

// copyFrames forwards AMQP frames (type, channel, size, payload, end byte)
// whole, each under mu.
func copyFrames(dst io.Writer, src io.Reader, mu *sync.Mutex) error {
	r := bufio.NewReader(src)
	header := make([]byte, 7)
	for {
		if _, err := io.ReadFull(r, header); err != nil {
			return err
		}
		rest := make([]byte, binary.BigEndian.Uint32(header[3:])+1)
		if _, err := io.ReadFull(r, rest); err != nil {
			return err
		}
		mu.Lock()
		_, err := dst.Write(append(slices.Clone(header), rest...))
		mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// Inject sends an AMQP method frame on channel 0 to every client, as if
// the broker had sent it: class 10 (connection), the given method and
// arguments.
func (p *proxy) Inject(method uint16, args []byte) {
	payload := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 10), method)
	payload = append(payload, args...)
	frame := append([]byte{1, 0, 0}, binary.BigEndian.AppendUint32(nil, uint32(len(payload)))...)
	frame = append(append(frame, payload...), 0xCE)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, mu := range p.clients {
		mu.Lock()
		_, _ = c.Write(frame)
		mu.Unlock()
	}
}

// Sever cuts every connection through the proxy, as a network failure
// would.
func (p *proxy) Sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// SetDown refuses (true) or again accepts (false) new connections.
func (p *proxy) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
}

func TestPublishConsumeCarriesIDKeyAndHeaders(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, false)
	require.NoError(t, p.Publish(t.Context(), []broker.Message{msg(1), msg(2)}))

	c := f.consumer(t, false)
	for i := 1; i <= 2; i++ {
		d := receive(t, c)
		require.Equal(t, msg(i), d.Message())
		require.Equal(t, broker.Source{Queue: f.queue.Name}, d.Source())
		require.NoError(t, d.Ack(t.Context()))
		require.ErrorIs(t, d.Ack(t.Context()), rabbitmq.ErrSettled)
	}
}

// A message no queue is bound for is confirmed by the broker, but
// returned first: it is a failure of that message only.
func TestUnroutableMessageFailsAlone(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, false)
	msgs := []broker.Message{msg(1), msg(2), msg(3)}
	msgs[1].Topic = "nobody.listens"
	err := p.Publish(t.Context(), msgs)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	require.ErrorIs(t, pe.Failed[1], rabbitmq.ErrUnroutable)
	require.ErrorContains(t, pe.Failed[1], "NO_ROUTE")

	c := f.consumer(t, false)
	for _, want := range []string{"ev-1", "ev-3"} {
		d := receive(t, c)
		require.Equal(t, want, d.Message().ID)
		require.NoError(t, d.Ack(t.Context()))
	}
}

func TestPublishRejectsInvalidMessagesIndividually(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, false)
	msgs := []broker.Message{msg(1), {Topic: "orders.created", Body: []byte("{}")}}
	err := p.Publish(t.Context(), msgs)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	require.ErrorIs(t, pe.Failed[1], rabbitmq.ErrInvalidMessage)
	require.ErrorContains(t, pe.Failed[1], "Message.ID")
}

// While the connection is down, Publish fails at once with
// ErrNotConnected; once the broker is reachable again, it works.
func TestPublishWhileDisconnectedFailsFast(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, true)
	f.proxy.SetDown(true)
	f.proxy.Sever()

	require.Eventually(t, func() bool {
		start := time.Now()
		err := p.Publish(t.Context(), []broker.Message{msg(1)})
		return errors.Is(err, rabbitmq.ErrNotConnected) && time.Since(start) < 100*time.Millisecond
	}, 10*time.Second, 10*time.Millisecond)

	f.proxy.SetDown(false)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	require.NoError(t, p.WaitConnected(ctx))
	require.NoError(t, p.Publish(t.Context(), []broker.Message{msg(1)}))
	require.NoError(t, p.Close())
	require.ErrorIs(t, p.Publish(t.Context(), []broker.Message{msg(2)}), broker.ErrClosed)
}

// A Nacked delivery comes back after the requeue delay; a Rejected one
// goes to the dead-letter queue.
func TestNackRequeuesAndRejectDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, false)
	require.NoError(t, p.Publish(t.Context(), []broker.Message{msg(1), msg(2)}))
	c := f.consumer(t, false)

	first := receive(t, c)
	require.Equal(t, "ev-1", first.Message().ID)
	require.NoError(t, first.Nack(t.Context()))
	second := receive(t, c)
	require.Equal(t, "ev-2", second.Message().ID)
	require.NoError(t, second.Reject(t.Context(), errors.New("cannot be processed")))

	again := receive(t, c)
	require.Equal(t, "ev-1", again.Message().ID)
	rd, ok := again.(*rabbitmq.Delivery)
	require.True(t, ok)
	require.True(t, rd.Redelivered())
	require.NoError(t, again.Ack(t.Context()))

	require.Eventually(t, func() bool {
		d, ok := f.getDeadLetter(t)
		return ok && d.MessageId == "ev-2"
	}, 10*time.Second, 20*time.Millisecond)
}

// A delivery whose channel closed cannot be acknowledged: the ack fails
// and the broker redelivers the message.
func TestAckAfterConnectionLossFailsAndRedelivers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, false)
	require.NoError(t, p.Publish(t.Context(), []broker.Message{msg(1)}))
	c := f.consumer(t, true)
	d := receive(t, c)
	f.proxy.Sever()
	// The redelivery arrives on the next connection; the first delivery's
	// channel is gone by then.
	again := receive(t, c)
	require.Equal(t, "ev-1", again.Message().ID)
	require.ErrorIs(t, d.Ack(t.Context()), rabbitmq.ErrConnectionLost)
	require.NoError(t, again.Ack(t.Context()))
}

// While the broker blocks the connection (a resource alarm, here a
// connection.blocked frame slipped in by the proxy), Publish fails at once
// with ErrBlocked; once unblocked, it publishes again.
func TestBlockedConnectionFailsPublishFast(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, true)
	const blocked, unblocked = 60, 61
	reason := "low on memory"
	f.proxy.Inject(blocked, append([]byte{byte(len(reason))}, reason...))
	require.Eventually(t, func() bool {
		start := time.Now()
		err := p.Publish(t.Context(), []broker.Message{msg(1)})
		return errors.Is(err, rabbitmq.ErrBlocked) && strings.Contains(err.Error(), reason) && time.Since(start) < 100*time.Millisecond
	}, 10*time.Second, 10*time.Millisecond)

	f.proxy.Inject(unblocked, nil)
	require.Eventually(t, func() bool {
		return p.Publish(t.Context(), []broker.Message{msg(1)}) == nil
	}, 10*time.Second, 10*time.Millisecond)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{Window: -1})
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	require.ErrorContains(t, err, "Window")
	_, err = rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{})
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	require.ErrorContains(t, err, "Queue")
	_, err = rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: rabbitmq.ConnConfig{URL: "http://nope"}})
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	err = rabbitmq.Topology{Queues: []rabbitmq.Queue{{Name: "q", Type: rabbitmq.Classic, DeliveryLimit: 3}}}.Validate()
	require.ErrorIs(t, err, rabbitmq.ErrInvalidConfig)
	require.ErrorContains(t, err, "DeliveryLimit")
}

// A quorum queue with a delivery limit dead-letters a message that keeps
// failing instead of redelivering it forever.
func TestDeliveryLimitDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Queue{Bindings: []string{"orders.#"}, DeliveryLimit: 1})
	p := f.publisher(t, false)
	require.NoError(t, p.Publish(t.Context(), []broker.Message{msg(1)}))
	c := f.consumer(t, false)
	deliveries := 0
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		d, err := c.Receive(ctx)
		cancel()
		if err != nil {
			break // no more deliveries: dead-lettered
		}
		deliveries++
		require.LessOrEqual(t, deliveries, 3)
		require.NoError(t, d.Nack(t.Context()))
	}
	dead, ok := f.getDeadLetter(t)
	require.True(t, ok)
	require.Equal(t, "ev-1", dead.MessageId)
	deaths, ok := dead.Headers["x-death"].([]any)
	require.True(t, ok)
	death, ok := deaths[0].(amqp.Table)
	require.True(t, ok)
	require.Equal(t, "delivery_limit", death["reason"])
}

// Classic queues are an option; their dead-lettering works the same way
// (at most once).
func TestClassicQueueRejectDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Queue{Bindings: []string{"orders.#"}, Type: rabbitmq.Classic})
	p := f.publisher(t, false)
	require.NoError(t, p.Publish(t.Context(), []broker.Message{msg(1)}))
	c := f.consumer(t, false)
	require.NoError(t, receive(t, c).Reject(t.Context(), errors.New("bad")))
	require.Eventually(t, func() bool {
		d, ok := f.getDeadLetter(t)
		return ok && d.MessageId == "ev-1"
	}, 10*time.Second, 20*time.Millisecond)
}

// Concurrent Receive calls share the deliveries: each message goes to one.
func TestConcurrentReceive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.publisher(t, false)
	msgs := make([]broker.Message, 200)
	for i := range msgs {
		msgs[i] = msg(i)
	}
	require.NoError(t, p.Publish(t.Context(), msgs))
	c := f.consumer(t, false)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				d, err := c.Receive(ctx)
				cancel()
				if err != nil {
					return
				}
				mu.Lock()
				seen[d.Message().ID]++
				mu.Unlock()
				if err := d.Ack(t.Context()); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, len(msgs))
	for id, n := range seen {
		require.Equal(t, 1, n, id)
	}
}

// BenchmarkPublish measures confirmed publishing through the Publisher in
// batches of 100 (the queue is a durable quorum queue on the real broker).
func BenchmarkPublish(b *testing.B) {
	f := setup(b)
	p := f.publisher(b, false)
	msgs := make([]broker.Message, 100)
	for i := range msgs {
		msgs[i] = msg(i)
	}
	for b.Loop() {
		if err := p.Publish(b.Context(), msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
}
