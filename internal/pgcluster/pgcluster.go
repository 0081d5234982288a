package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cluster is one throwaway PostgreSQL cluster.
type Cluster struct {
	bin, dir, data string
	port           int
	cred           *syscall.Credential // the postgres OS user's, when the test runs as root

	mu      sync.Mutex
	running bool
}

// New initializes a cluster in t.TempDir(), starts it and stops it when
// the test ends. It skips the test when no PostgreSQL binaries are
// installed, and fails it when the cluster cannot be made or started.
func New(t testing.TB) *Cluster {
	t.Helper()
	bin, err := binaries()
	if err != nil {
		t.Skipf("pgcluster: no PostgreSQL binaries to run a cluster of the test's own: %v", err)
	}
	c := &Cluster{bin: bin, dir: t.TempDir()}
	c.data = filepath.Join(c.dir, "data")
	if os.Geteuid() == 0 {
		if c.cred, err = postgresUser(); err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
		if err := c.handOver(); err != nil {
			t.Fatalf("pgcluster: %v", err)
		}
	}
	if c.port, err = FreePort(t.Context()); err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	if err := c.run(t.Context(), "initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-N"); err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.stop(context.Background(), "immediate"); err != nil {
			t.Errorf("pgcluster: %v", err)
		}
	})
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	return c
}

// URL is the cluster's connection string, the same across restarts.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// Start starts the cluster, on its port and with its data, and returns
// once it accepts connections. Starting a running cluster does nothing.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	opts := strings.Join([]string{
		"-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=''", // a test's directory may be too long a path for a socket
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
	}, " ")
	if err := c.run(ctx, "pg_ctl", "-D", c.data, "-o", opts, "-l", c.logFile(), "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("%w\n%s", err, c.logTail())
	}
	c.running = true
	return nil
}

// Stop shuts the cluster down fast and returns once it is down: sessions
// are ended (they see SQLSTATE 57P01), the server checkpoints and exits.
// Stopping a stopped cluster does nothing.
func (c *Cluster) Stop(ctx context.Context) error { return c.stop(ctx, "fast") }

// Crash stops the cluster at once, without a checkpoint, as a power cut
// would: the next Start recovers from the WAL.
func (c *Cluster) Crash(ctx context.Context) error { return c.stop(ctx, "immediate") }

// Restart stops the cluster fast, waits down, and starts it again.
func (c *Cluster) Restart(ctx context.Context, down time.Duration) error {
	if err := c.Stop(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	return c.Start(ctx)
}

func (c *Cluster) stop(ctx context.Context, mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	if err := c.run(ctx, "pg_ctl", "-D", c.data, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return fmt.Errorf("%w\n%s", err, c.logTail())
	}
	c.running = false
	return nil
}

// run runs one of the binaries, as the postgres OS user when the test
// runs as root.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func (c *Cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

// logTail is the end of the server's log, for an error.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	const most = 4000
	return string(b[max(0, len(b)-most):])
}

// handOver makes the cluster's directory the postgres user's, and lets
// that user reach it through the test's temporary directory.
func (c *Cluster) handOver() error {
	if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return err
	}
	return os.Chmod(filepath.Dir(c.dir), 0o711) // traverse only
}

// binaries finds the directory of the PostgreSQL server binaries.
func binaries() (string, error) {
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		if resolved, err := filepath.EvalSymlinks(path); err == nil {
			path = resolved
		}
		return filepath.Dir(path), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("pg_ctl is not on PATH and /usr/lib/postgresql/*/bin holds none")
}

// version is the major version in a /usr/lib/postgresql/N/bin path.
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// postgresUser is the credential of the postgres OS user.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs the postgres OS user to run as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// FreePort is a TCP port of 127.0.0.1 that nobody listened on a moment
// ago.
func FreePort(ctx context.Context) (int, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("a TCP listener's address is a %T", l.Addr())
	}
	return addr.Port, nil
}
