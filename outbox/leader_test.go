package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/outbox"
)

// writeEvents writes n events on topic "orders", keys key-0 .. key-(keys-1)
// round robin, payload {"n": i}.
func (f relayFixture) writeEvents(t *testing.T, from, n, keys int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		_, err := f.store.Write(t.Context(), f.db.Pool, outbox.Event{
			Topic: "orders", Key: fmt.Sprintf("key-%d", i%keys), Type: "order.changed",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		})
		require.NoError(t, err)
	}
}

func activeCount(relays []*outbox.Relay) int {
	n := 0
	for _, r := range relays {
		if r.Active() {
			n++
		}
	}
	return n
}

// Of several relays running on one outbox, one is active and the others
// stand by; the active one publishes everything.
func TestOneRelayIsActive(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	relays := make([]*outbox.Relay, 4)
	for i := range relays {
		relays[i], _ = f.runRelay(t, b.Publisher(), outbox.RelayConfig{ID: fmt.Sprintf("pod-%d", i), StandbyPoll: 50 * time.Millisecond})
	}
	require.Eventually(t, func() bool { return activeCount(relays) == 1 }, 10*time.Second, 5*time.Millisecond)
	f.writeEvents(t, 0, 200, 10)
	// While the backlog drains, never more than one relay is active.
	for f.pending(t) > 0 {
		require.Equal(t, 1, activeCount(relays), "exactly one relay is active")
	}
	var holder string
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT holder FROM "+f.db.Schema+".outbox_relay_lease").Scan(&holder))
	for i, r := range relays {
		require.Equal(t, holder == fmt.Sprintf("pod-%d", i), r.Active(), "pod-%d", i)
	}
	require.Len(t, drain(t, b, 200), 200)
}

// A relay whose Run ends releases the lease: a standby takes over at its
// next check, long before the lease would have run out.
func TestStoppedRelayHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	cfg := outbox.RelayConfig{LeaderLease: time.Minute, StandbyPoll: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond}
	cfg.ID = "first"
	first, stopFirst := f.runRelay(t, b.Publisher(), cfg)
	require.Eventually(t, first.Active, 10*time.Second, 5*time.Millisecond)
	cfg.ID = "second"
	second, _ := f.runRelay(t, b.Publisher(), cfg)

	stopFirst()
	require.False(t, first.Active())
	require.Eventually(t, second.Active, 5*time.Second, 5*time.Millisecond, "taken over at the next check, not after the minute's lease")
	f.writeEvents(t, 0, 10, 3)
	require.Len(t, drain(t, b, 10), 10)
}

// gatedPublisher publishes its first call only when open is closed, and
// signals entered when that call starts.
type gatedPublisher struct {
	broker.Publisher
	once          sync.Once
	entered, open chan struct{}
}

func (p *gatedPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.entered)
		<-p.open
	}
	return p.Publisher.Publish(context.WithoutCancel(ctx), msgs)
}

// An active relay that lost its lease while it was publishing (paused past
// the lease, and another relay took it) claims nothing more when it goes
// on: its batches in flight are recorded, its next claim is fenced out by
// the new epoch, and its renewal makes it stand by. When the lease is free
// again it takes it back and publishes the rest.
func TestDeposedRelayClaimsNothing(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	const lease = 6 * time.Second
	f.writeEvents(t, 0, 10, 10)
	pub := &gatedPublisher{Publisher: b.Publisher(), entered: make(chan struct{}), open: make(chan struct{})}
	r, _ := f.runRelay(t, pub, outbox.RelayConfig{ID: "deposed", BatchSize: 5, LeaderLease: lease, StandbyPoll: 100 * time.Millisecond})

	select { // the first batch is in flight; the second is claimed beside it
	case <-pub.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay published nothing within 30s")
	}
	require.Eventually(t, func() bool {
		var held int
		require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE claimed_by = 'deposed'").Scan(&held))
		return held == 10
	}, 10*time.Second, 5*time.Millisecond)
	// Another relay takes the lease over, as after the lease ran out.
	_, err := f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox_relay_lease SET holder = 'usurper', lease_epoch = lease_epoch + 1, lease_until = now() + interval '1 hour'")
	require.NoError(t, err)
	f.writeEvents(t, 10, 10, 10)
	close(pub.open)

	// Both batches it held are published and recorded; the verdict on the
	// second went with a claim, which the new epoch fenced out. The relay
	// is awaited until it stands by, so that what follows is its final
	// state, not a value the backlog passes through on its way down.
	require.Eventually(t, func() bool { return !r.Active() }, 2*lease, 10*time.Millisecond, "its renewal found the lease taken")
	require.Eventually(t, func() bool {
		var held int
		require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE claimed_by = 'deposed' AND published_at IS NULL").Scan(&held))
		return held == 0 && b.Published("orders") >= 10
	}, 10*time.Second, 5*time.Millisecond, "the batches it held were not settled")
	var claimed int
	require.NoError(t, f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.db.Schema+".outbox WHERE published_at IS NULL AND claimed_by IS NOT NULL").Scan(&claimed))
	require.Zero(t, claimed, "the deposed relay claimed something after it lost the lease")
	require.Equal(t, 10, b.Published("orders"), "the deposed relay published what it claimed after it lost the lease")
	require.Equal(t, 10, f.pending(t), "the events written after the takeover wait for the new holder")

	_, err = f.db.Pool.Exec(t.Context(), "UPDATE "+f.db.Schema+".outbox_relay_lease SET lease_until = '-infinity'")
	require.NoError(t, err)
	require.Eventually(t, r.Active, 10*time.Second, 5*time.Millisecond, "it takes the free lease back")
	require.Len(t, drain(t, b, 20), 20)
}

// Without a configured Logger, the relay's warnings go to slog.Default().
func TestRelayWarnsThroughTheDefaultLogger(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	var out telemetrytest.LogBuffer
	// The default logger is the process's: other tests' relays may log
	// here too, so the check looks for this relay's attribute.
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&out, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	refuse := publisherFunc(func(context.Context, []broker.Message) error { return errors.New("injected: broker refused") })
	r, err := f.store.NewRelay(f.db.Pool, refuse, outbox.RelayConfig{ID: "loud-relay"})
	require.NoError(t, err)
	f.writeEvents(t, 0, 1, 1)
	res, err := r.RelayOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Failed)
	require.Contains(t, out.String(), "level=WARN msg=\"llmq: outbox events not confirmed; they will be retried\" relay=loud-relay")
}

// connections counts the backends whose application_name is name, and
// those of them listening.
func (f relayFixture) connections(ctx context.Context, name string) (all, listening int, err error) {
	err = f.db.Pool.QueryRow(ctx,
		"SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%') FROM pg_stat_activity WHERE application_name = $1", name).Scan(&all, &listening)
	return all, listening, err
}

// relayPool is a pool of its own for one relay, named in pg_stat_activity,
// that closes connections idle for idle.
func relayPool(t *testing.T, name string, idle time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = 8
	cfg.MaxConnIdleTime = idle
	cfg.HealthCheckPeriod = idle / 2
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// The connection budget of package doc: the active relay uses at most
// four connections, one of them listening; a standby holds none between
// its checks, at most one during one, and never listens.
func TestRelayConnectionBudget(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	b := memory.New(memory.Config{})
	suffix := f.db.Schema // unique per test run
	activeName, standbyName := "active-"+suffix, "standby-"+suffix
	run := func(pool *pgxpool.Pool, id string) *outbox.Relay {
		r, err := f.store.NewRelay(pool, b.Publisher(), outbox.RelayConfig{ID: id, StandbyPoll: 500 * time.Millisecond, BatchSize: 20})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		return r
	}
	active := run(relayPool(t, activeName, time.Minute), "active")
	require.Eventually(t, active.Active, 10*time.Second, 5*time.Millisecond)
	standbyPool := relayPool(t, standbyName, 100*time.Millisecond)
	standby := run(standbyPool, "standby")

	// Sample the backends of both relays until the backlog is drained and
	// the standby has checked the lease three times.
	var peakActive, peakStandby, idleStandby, listeningStandby, listeningActive int
	var sampleErr error
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond) // pg_stat_activity cannot signal a change
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			all, listening, err := f.connections(t.Context(), activeName)
			peakActive, listeningActive = max(peakActive, all), max(listeningActive, listening)
			if err == nil {
				all, listening, err = f.connections(t.Context(), standbyName)
				peakStandby, listeningStandby = max(peakStandby, all), max(listeningStandby, listening)
			}
			if err != nil {
				sampleErr = err
				return
			}
			if all == 0 {
				idleStandby++
			}
		}
	}()
	f.writeEvents(t, 0, 2000, 50)
	require.Eventually(t, func() bool { return f.pending(t) == 0 && standbyPool.Stat().NewConnsCount() >= 3 }, 60*time.Second, 10*time.Millisecond,
		"the backlog drained and the standby checked three times")
	close(stopSampling)
	<-sampled
	require.NoError(t, sampleErr)
	require.False(t, standby.Active())
	require.LessOrEqual(t, peakActive, 4, "the active relay's budget")
	require.GreaterOrEqual(t, peakActive, 2, "the active relay listens and claims")
	require.LessOrEqual(t, peakStandby, 1, "a standby's budget")
	require.Equal(t, 1, listeningActive, "the active relay listens on one connection")
	require.Zero(t, listeningStandby, "a standby does not listen")
	require.Positive(t, idleStandby, "between checks a standby holds no connection")
}

// A bad relay configuration is refused with ErrInvalidRelayConfig, naming
// the field.
func TestNewRelayRejectsBadConfig(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	pub := memory.New(memory.Config{}).Publisher()
	for _, tc := range []struct {
		cfg   outbox.RelayConfig
		field string
	}{
		{outbox.RelayConfig{LeaderLease: -time.Second}, "LeaderLease"},
		{outbox.RelayConfig{LeaderLease: 10 * time.Millisecond}, "LeaderLease"},
		{outbox.RelayConfig{StandbyPoll: -time.Second}, "StandbyPoll"},
		{outbox.RelayConfig{LeaderLease: time.Second, StandbyPoll: 2 * time.Second}, "StandbyPoll"},
		{outbox.RelayConfig{StandbyPoll: 11 * time.Second}, "StandbyPoll"}, // longer than the default lease
		{outbox.RelayConfig{BatchSize: 1001}, "BatchSize"},
		{outbox.RelayConfig{ClaimLease: -time.Second}, "ClaimLease"},
	} {
		_, err := f.store.NewRelay(f.db.Pool, pub, tc.cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidRelayConfig, "%+v", tc.cfg)
		require.ErrorContains(t, err, tc.field)
	}
	_, err := f.store.NewRelay(nil, pub, outbox.RelayConfig{})
	require.ErrorIs(t, err, outbox.ErrInvalidRelayConfig)
	_, err = f.store.NewRelay(f.db.Pool, pub, outbox.RelayConfig{LeaderLease: time.Second, StandbyPoll: time.Second})
	require.NoError(t, err, "a standby may check once per lease")
}

// A standby waits until the lease it saw would expire, within half of
// StandbyPoll and all of it, shortened by up to an eighth at random.
func TestStandbyWaitsUntilTheLeaseCouldExpire(t *testing.T) {
	t.Parallel()
	f := setupRelay(t)
	r, err := f.store.NewRelay(f.db.Pool, memory.New(memory.Config{}).Publisher(), outbox.RelayConfig{StandbyPoll: 4 * time.Second})
	require.NoError(t, err)
	for _, c := range []struct{ expiresIn, want time.Duration }{
		{3 * time.Second, 3 * time.Second}, // until the expiry
		{time.Second, 2 * time.Second},     // at least half of StandbyPoll
		{0, 2 * time.Second},               // unknown or free: half of StandbyPoll
		{time.Hour, 4 * time.Second},       // at most StandbyPoll
		{4 * time.Second, 4 * time.Second}, // the edge
		{2500 * time.Millisecond, 2500 * time.Millisecond},
	} {
		for range 100 {
			wait := outbox.StandbyWait(r, c.expiresIn)
			require.LessOrEqual(t, wait, c.want, "expires in %v", c.expiresIn)
			require.GreaterOrEqual(t, wait, c.want-c.want/8, "expires in %v", c.expiresIn)
		}
	}
}
