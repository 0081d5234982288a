// Package pgbouncertest runs a real PgBouncer in transaction pooling mode
// in front of the test server, for tests that prove llmq works behind a
// connection pooler. Each test gets a PgBouncer process of its own, on a
// free loopback port, stopped when the test ends; the server behind it is
// never reconfigured.
//
// The binary is LLMQ_PGBOUNCER, else pgbouncer on PATH or in /usr/sbin
// (Debian's package; scripts/services installs it). Without one the test
// fails saying how to get it, unless LLMQ_SKIP_PGBOUNCER=1 asks to skip
// such tests on purpose. PgBouncer refuses to run as root: as root, it is
// started as the postgres user.
package pgbouncertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbtest"
)

// Options adjusts a Bouncer; the zero value pools into 10 server
// connections.
type Options struct {
	// PoolSize is how many server connections PgBouncer opens for the
	// test's database and user (default_pool_size). Default 10.
	PoolSize int
}

// Bouncer is one PgBouncer process in transaction pooling mode.
type Bouncer struct {
	addr   string
	target *url.URL
	log    *syncBuffer
}

// Start runs PgBouncer in front of the server at dbtest.URL() until t ends.
func Start(t testing.TB, opts ...Options) *Bouncer {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	bin := binary(t)
	target, err := url.Parse(dbtest.URL())
	if err != nil {
		t.Fatalf("pgbouncertest: DATABASE_URL: %v", err)
	}
	// Not t.TempDir(): its parent is private to this user, and PgBouncer
	// may run as another.
	dir, err := os.MkdirTemp("", "llmq-pgbouncer-")
	if err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	log := &syncBuffer{}
	var b *Bouncer
	// The port is free when chosen and taken by PgBouncer a moment later;
	// another process may take it in between, so a failed start tries
	// another port.
	for try := 1; ; try++ {
		port := freePort(t)
		proc, err := start(t.Context(), bin, dir, config(target, port, o), log)
		if err == nil {
			b = &Bouncer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), target: target, log: log}
			if err = b.await(proc); err == nil {
				t.Cleanup(proc.stop)
				break
			}
			proc.stop()
		}
		if try == 3 {
			t.Fatalf("pgbouncertest: starting %s: %v\n%s", bin, err, log.String())
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncertest: PgBouncer's log:\n%s", log.String())
		}
	})
	return b
}

// URL is DATABASE_URL through the bouncer, with pgx's
// default_query_exec_mode set to mode (cache_statement, cache_describe,
// describe_exec, exec or simple_protocol); "" keeps pgx's default.
func (b *Bouncer) URL(mode string) string {
	u := *b.target
	u.Host = b.addr
	q := u.Query()
	q.Set("sslmode", "disable")
	if mode != "" {
		q.Set("default_query_exec_mode", mode)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Log is what PgBouncer has logged so far.
func (b *Bouncer) Log() string { return b.log.String() }

// await waits until PgBouncer answers a query, or it exits.
func (b *Bouncer) await(proc *process) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, b.URL("simple_protocol"))
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-proc.done:
			return fmt.Errorf("PgBouncer exited (%w) before it answered: %w", proc.err, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PgBouncer did not answer within 15s: %w", err)
		}
	}
}

func binary(t testing.TB) string {
	t.Helper()
	if os.Getenv("LLMQ_SKIP_PGBOUNCER") == "1" {
		t.Skip("pgbouncertest: LLMQ_SKIP_PGBOUNCER=1: the tests behind PgBouncer are skipped on purpose")
	}
	if bin := os.Getenv("LLMQ_PGBOUNCER"); bin != "" {
		return bin
	}
	if bin, err := exec.LookPath("pgbouncer"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	t.Fatal("pgbouncertest: no pgbouncer found for the tests behind a connection pooler: install Debian's pgbouncer " +
		"(as root: apt-get install -y pgbouncer, or run scripts/services, which make test runs first), set LLMQ_PGBOUNCER " +
		"to a PgBouncer binary, or set LLMQ_SKIP_PGBOUNCER=1 to skip these tests on purpose")
	return ""
}

// config is a PgBouncer configuration in transaction pooling mode that
// lets any client in as the target's user: a test's throwaway pooler on
// loopback, never a deployment's.
func config(target *url.URL, port int, o Options) string {
	host, serverPort := target.Hostname(), target.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if serverPort == "" {
		serverPort = "5432"
	}
	userName := target.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	poolSize := o.PoolSize
	if poolSize <= 0 {
		poolSize = 10
	}
	return fmt.Sprintf(`[databases]
* = host=%s port=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
server_lifetime = 3600
log_connections = 0
log_disconnections = 0
`, host, serverPort, userName, port, poolSize)
}

// process is a running PgBouncer.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited
	err  error         // how it exited, once done is closed
}

// stop kills the process and waits until it is gone.
func (p *process) stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// start writes cfg into dir and starts PgBouncer on it, as the postgres
// user when this process is root, logging into log. It lives until ctx
// ends or it is stopped.
func start(ctx context.Context, bin, dir, cfg string, log *syncBuffer) (*process, error) {
	path := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, path)
	cmd.Stdout, cmd.Stderr = log, log
	// The bouncer dies with the test binary, even a killed one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		cred, err := postgresUser()
		if err != nil {
			return nil, err
		}
		for _, p := range []string{dir, path} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
		cmd.SysProcAttr.Credential = cred
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PgBouncer refuses to run as root and there is no postgres user to run it as: %w", err)
	}
	uid, errUID := strconv.ParseUint(u.Uid, 10, 32)
	gid, errGID := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(errUID, errGID); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort(t testing.TB) int {
	t.Helper()
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgbouncertest: finding a free port: %v", err)
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("pgbouncertest: a TCP listener's address is a %T", l.Addr())
	}
	return addr.Port
}

// syncBuffer is a bytes.Buffer safe for PgBouncer's output and the test's
// reads at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}
