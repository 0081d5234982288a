package admission_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// proxy forwards TCP connections to Postgres until cut, which closes the
// listener and every forwarded connection: the database becomes unreachable
// for whoever connects through it, and only for them.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln}
	t.Cleanup(p.Cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !p.track(c, up) {
				return
			}
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return p
}

func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// Cut makes the database unreachable through the proxy.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	_ = p.ln.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// proxiedLimiter is a Postgres limiter on f's schema whose connections go
// through a proxy the test can cut.
func (f *fixture) proxiedLimiter(cfg admission.Config) (*admission.Postgres, *proxy) {
	f.t.Helper()
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(f.t, err)
	p := newProxy(f.t, net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port))))
	host, port, err := net.SplitHostPort(p.ln.Addr().String())
	require.NoError(f.t, err)
	n, err := strconv.Atoi(port)
	require.NoError(f.t, err)
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = host, uint16(n)
	pcfg.ConnConfig.ConnectTimeout = time.Second
	db, err := pgxpool.NewWithConfig(f.t.Context(), pcfg)
	require.NoError(f.t, err)
	f.t.Cleanup(db.Close)
	cfg.Schema = f.schema
	cfg.Timeout = time.Second
	l, err := admission.NewPostgres(db, cfg)
	require.NoError(f.t, err)
	return l, p
}

func TestUnreachableFailsClosed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "p", RPM: 6000, TPM: 1e6, MaxInFlight: 50}))
	logs := &recordedLogs{}
	l, p := f.proxiedLimiter(admission.Config{Logger: slog.New(logs)})
	permit, err := l.Acquire(t.Context(), admission.Request{Pool: "p"})
	require.NoError(t, err)
	p.Cut()

	require.Error(t, permit.Release(t.Context(), admission.CallOutcome{Result: admission.CallAnswered}),
		"a release that cannot reach the database says so; the permit expires instead")
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		_, err := l.Acquire(t.Context(), admission.Request{Pool: "p"})
		require.ErrorIs(t, err, admission.ErrUnavailable)
		require.NotErrorIs(t, err, admission.ErrWait, "an outage is not a wait the caller could sit out")
	}

	require.Equal(t, []string{"ERROR admission: the limiter's database cannot be reached; failing closed"}, logs.messages(),
		"the outage is logged once, however many acquires it refuses")

	// The caller's own cancellation is not an outage.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = l.Acquire(ctx, admission.Request{Pool: "p"})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, admission.ErrUnavailable)
}

// With an emergency allowance of 10% for 2s, one process admits at most
// floor(0.1·RequestBurst) + 0.1·RPM/60·2s requests and holds at most
// max(1, floor(0.1·MaxInFlight)) permits; then it fails closed.
func TestUnreachableEmergencyAllowance(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pool := admission.Pool{Name: "p", RPM: 600, TPM: 1e6, MaxInFlight: 20, RequestBurst: 10}
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	policy := admission.FailurePolicy{Fraction: 0.1, For: 2 * time.Second}

	t.Run("requests", func(t *testing.T) {
		t.Parallel()
		l, p := f.proxiedLimiter(admission.Config{OnUnavailable: policy})
		warm, err := l.Acquire(t.Context(), admission.Request{Pool: "p"})
		require.NoError(t, err, "the first acquire reads the pool's limits")
		require.NoError(t, warm.Release(t.Context(), admission.CallOutcome{}))
		p.Cut()
		start := time.Now()
		granted := 0
		var lastGrant time.Time
		for time.Since(start) < policy.For+time.Second {
			permit, err := l.Acquire(t.Context(), admission.Request{Pool: "p", Tokens: 10})
			if err == nil {
				granted++
				lastGrant = time.Now()
				require.NoError(t, permit.Release(t.Context(), admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 10}))
				continue
			}
			if time.Since(start) > policy.For+100*time.Millisecond {
				require.ErrorIs(t, err, admission.ErrUnavailable, "the allowance ends after For")
			} else if !errors.Is(err, admission.ErrWait) {
				require.ErrorIs(t, err, admission.ErrUnavailable)
			}
			time.Sleep(10 * time.Millisecond) // polling a rate, not waiting for an event
		}
		bound := 1 + 0.1*600/60*policy.For.Seconds()
		require.LessOrEqual(t, float64(granted), bound)
		require.GreaterOrEqual(t, granted, 2, "the allowance admits some work")
		require.Less(t, lastGrant.Sub(start), policy.For+100*time.Millisecond)
	})

	t.Run("in flight", func(t *testing.T) {
		t.Parallel()
		l, p := f.proxiedLimiter(admission.Config{OnUnavailable: policy})
		_, err := l.State(t.Context(), "p")
		require.NoError(t, err)
		p.Cut()
		held := 0
		for range 20 {
			if _, err := l.Acquire(t.Context(), admission.Request{Pool: "p"}); err == nil {
				held++
			}
		}
		require.Equal(t, 1, held, "floor(0.1·MaxInFlight)=2 slots, but the request burst of floor(0.1·10)=1 binds first")
	})
}

// recordedLogs keeps the level and message of every record.
type recordedLogs struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordedLogs) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *recordedLogs) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recordedLogs) WithGroup(string) slog.Handler      { return r }

func (r *recordedLogs) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

func TestFailurePolicyValidation(t *testing.T) {
	t.Parallel()
	for _, bad := range []admission.FailurePolicy{{Fraction: 0.5}, {Fraction: 1.5, For: time.Second}, {Fraction: -1, For: time.Second}, {For: time.Second}} {
		_, err := admission.NewPostgres(nil, admission.Config{OnUnavailable: bad})
		require.ErrorIs(t, err, admission.ErrInvalid, "%+v", bad)
	}
}

// runDefaultLogger is a child process: with slog's default logger writing
// to stdout and no Logger configured, it acquires from a limiter whose
// database refuses connections, and exits.
func runDefaultLogger() int {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stdout, nil))) // this process's own default
	ctx := context.Background()
	db, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	l, err := admission.NewPostgres(db, admission.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := l.Acquire(ctx, admission.Request{Pool: "p"}); !errors.Is(err, admission.ErrUnavailable) {
		fmt.Fprintln(os.Stderr, "want ErrUnavailable, got", err)
		return 1
	}
	return 0
}

// With no Logger configured, the limiter's errors go to slog.Default(),
// not nowhere. (A child process, so that setting the default logger
// touches no other test.)
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=default-logger")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "level=ERROR")
	require.Contains(t, string(out), "the limiter's database cannot be reached; failing closed")
}
