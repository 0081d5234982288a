// Package serve runs the examples' HTTP servers until their context ends,
// with limits on what one client can hold of them.
//
// It is under examples/internal, which a program outside this module
// cannot import: a service copying an example copies this package with it
// (it imports only public packages; TestExamplesImportOnlyWhatAHostCan in
// the module's root checks that every example does too).
package serve

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Default limits of a server.
const (
	DefaultReadHeader     = 5 * time.Second
	DefaultRead           = 30 * time.Second
	DefaultWrite          = 60 * time.Second
	DefaultIdle           = 60 * time.Second
	DefaultMaxHeaderBytes = 64 << 10
)

// Limits bound what one client can hold of a server (a connection, its
// goroutine and its buffers) however slowly it sends, reads or idles. A zero
// field takes its default.
type Limits struct {
	// ReadHeader bounds reading a request's headers. Default 5s.
	ReadHeader time.Duration
	// Read bounds reading a whole request, body included. Default 30s.
	Read time.Duration
	// Write bounds a response, from the end of the request's headers to its
	// last byte. Default 60s. A handler that streams for longer (server-sent
	// events) lifts it for its own response with http.ResponseController
	// and sets a deadline per write instead.
	Write time.Duration
	// Idle bounds how long a keep-alive connection waits for its next
	// request. Default 60s.
	Idle time.Duration
	// MaxHeaderBytes bounds a request's headers; more is refused with 431.
	// Default 64 KiB.
	MaxHeaderBytes int
}

// Apply sets l's limits, defaults filled in, on srv.
func (l Limits) Apply(srv *http.Server) {
	srv.ReadHeaderTimeout = cmp.Or(l.ReadHeader, DefaultReadHeader)
	srv.ReadTimeout = cmp.Or(l.Read, DefaultRead)
	srv.WriteTimeout = cmp.Or(l.Write, DefaultWrite)
	srv.IdleTimeout = cmp.Or(l.Idle, DefaultIdle)
	srv.MaxHeaderBytes = cmp.Or(l.MaxHeaderBytes, DefaultMaxHeaderBytes)
}

// NewServer returns a server of h on addr with limits l.
func NewServer(addr string, h http.Handler, l Limits) *http.Server {
	srv := &http.Server{Addr: addr, Handler: h}
	l.Apply(srv)
	return srv
}

// HTTP listens on srv.Addr and serves srv as Serve does.
func HTTP(ctx context.Context, srv *http.Server, grace time.Duration) error {
	addr := cmp.Or(srv.Addr, ":http")
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return Serve(ctx, srv, ln, grace)
}

// Serve serves srv on ln until ctx ends, then shuts down: it stops
// accepting, gives requests in flight up to grace to finish, closes what is
// still open (event streams never finish; their clients reconnect), and
// returns only then, so that a caller that exits next cuts nothing short.
// It returns nil after a shutdown, or why the server could not serve.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
		defer cancel()
		if srv.Shutdown(shutdown) != nil {
			_ = srv.Close()
		}
	})
	err := srv.Serve(ln)
	if !errors.Is(err, http.ErrServerClosed) {
		if !stop() {
			<-done // ctx ended meanwhile: let its shutdown finish
		}
		return err
	}
	<-done
	return nil
}
