package serve_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/examples/internal/serve"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// short are limits a test can watch expire.
var short = serve.Limits{
	ReadHeader: 200 * time.Millisecond, Read: 400 * time.Millisecond, Write: 400 * time.Millisecond,
	Idle: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10,
}

// start serves h with limits on a loopback port until the test ends, and
// returns its address.
func start(t *testing.T, h http.Handler, limits serve.Limits) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve.Serve(ctx, serve.NewServer("", h, limits), ln, time.Second) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// dial opens a raw connection that gives up after 5s, far beyond every
// limit under test: a read that ends before then ended because the server
// closed the connection.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	return conn
}

// closedByServer reads conn to its end and requires that the server, not
// the client's deadline, ended it; it returns what was read.
func closedByServer(t *testing.T, conn net.Conn) string {
	t.Helper()
	data, err := io.ReadAll(conn)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the server held the connection")
	return string(data)
}

// within returns what ch delivers, failing the test if it takes more than
// 5s, far beyond every limit under test.
func within(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not end", what)
		return nil
	}
}

func TestLimitsBoundWhatAClientHolds(t *testing.T) {
	t.Parallel()
	bodyErr := make(chan error, 1)
	writeErr := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("POST /upload", func(_ http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		bodyErr <- err
	})
	mux.HandleFunc("GET /endless", func(w http.ResponseWriter, _ *http.Request) {
		chunk := []byte(strings.Repeat("x", 1024) + "\n")
		rc := http.NewResponseController(w)
		for {
			_, err := w.Write(chunk)
			if err == nil {
				err = rc.Flush()
			}
			if err != nil {
				writeErr <- err
				return
			}
		}
	})
	addr := start(t, mux, short)

	// Headers that never end are cut after ReadHeader.
	conn := dial(t, addr)
	_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n")
	require.NoError(t, err)
	closedByServer(t, conn)

	// A body that stops arriving fails its handler's read after Read.
	conn = dial(t, addr)
	_, err = io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b")
	require.NoError(t, err)
	require.Error(t, within(t, bodyErr, "the body's read"), "the body's read timed out")

	// A keep-alive connection is closed after Idle without a request (on a
	// server whose Read, which Go would use in place of an unset Idle, is
	// longer than the client waits).
	idle := start(t, mux, serve.Limits{Read: 10 * time.Second, Idle: 300 * time.Millisecond})
	conn = dial(t, idle)
	require.NoError(t, conn.SetDeadline(time.Now().Add(2*time.Second)))
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.Contains(t, closedByServer(t, conn), "200 OK", "answered, then closed when idle")

	// Headers over MaxHeaderBytes are refused.
	conn = dial(t, addr)
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("b", 8<<10)+"\r\n\r\n")
	require.NoError(t, err)
	status, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, status, "431")

	// A response that never ends fails its writes after Write, though the
	// client reads all it is sent.
	conn = dial(t, addr)
	_, err = io.WriteString(conn, "GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, conn) }()
	require.Error(t, within(t, writeErr, "the response's writes"), "the response's writes timed out")
}

// Serve returns only after the requests in flight at shutdown finished (or
// the grace ran out and they were closed), so that a process exiting next
// cuts none of them short.
func TestServeWaitsForRequestsInFlight(t *testing.T) {
	t.Parallel()
	entered, release, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			close(entered)
			<-r.Context().Done() // a stream: never ends by itself
			return
		}
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
		close(finished)
	})
	for _, path := range []string{"/slow", "/stream"} {
		entered = make(chan struct{})
		ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := serve.NewServer("", h, serve.Limits{})
		shuttingDown := make(chan struct{})
		srv.RegisterOnShutdown(func() { close(shuttingDown) })
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- serve.Serve(ctx, srv, ln, 300*time.Millisecond) }()

		conn := dial(t, ln.Addr().String())
		_, err = io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		<-entered
		cancel()
		<-shuttingDown
		if path == "/slow" {
			// Serve must still be waiting for the request: a return here
			// would end the process under it.
			select {
			case err := <-served:
				t.Fatalf("Serve returned (%v) with a request in flight", err)
			case <-time.After(100 * time.Millisecond):
			}
			close(release)
			require.NoError(t, <-served)
			select {
			case <-finished:
			default:
				t.Fatal("Serve returned before the request finished")
			}
			require.Contains(t, closedByServer(t, conn), "done")
			continue
		}
		// The stream outlives the grace: it is closed, and Serve returns.
		require.NoError(t, <-served)
		closedByServer(t, conn)
	}
}
