package main

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// cutListener wraps a listener so that the controller can sever every
// connection made through it and refuse new ones until it is restored: a
// broker that became unreachable. Refused connections are accepted and
// closed at once, as a peer that resets them.
type cutListener struct {
	net.Listener
	// serve, when set, handles each accepted connection itself (a proxy);
	// otherwise Accept returns it to the listener's owner (kfake).
	serve func(net.Conn)

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	cuts  int
}

func newCutListener(l net.Listener, serve func(net.Conn)) *cutListener {
	return &cutListener{Listener: l, serve: serve, conns: map[net.Conn]struct{}{}}
}

// Accept returns the next connection that is not refused.
func (c *cutListener) Accept() (net.Conn, error) {
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		if c.cut {
			c.mu.Unlock()
			_ = conn.Close()
			continue
		}
		tc := &trackedConn{Conn: conn, l: c}
		c.conns[tc] = struct{}{}
		c.mu.Unlock()
		return tc, nil
	}
}

// Cut closes every open connection and refuses new ones.
func (c *cutListener) Cut() {
	c.mu.Lock()
	c.cut = true
	c.cuts++
	conns := make([]net.Conn, 0, len(c.conns))
	for conn := range c.conns {
		conns = append(conns, conn)
	}
	c.mu.Unlock()
	for _, conn := range conns {
		_ = conn.Close()
	}
}

// Restore accepts connections again.
func (c *cutListener) Restore() {
	c.mu.Lock()
	c.cut = false
	c.mu.Unlock()
}

// run accepts and serves connections until the listener is closed.
func (c *cutListener) run() {
	for {
		conn, err := c.Accept()
		if err != nil {
			return
		}
		go c.serve(conn)
	}
}

type trackedConn struct {
	net.Conn
	l    *cutListener
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() {
		t.l.mu.Lock()
		delete(t.l.conns, t)
		t.l.mu.Unlock()
	})
	return t.Conn.Close()
}

// newProxy listens on a loopback port and forwards each connection to
// target; its Cut severs them all.
func newProxy(ctx context.Context, target string) (*cutListener, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var p *cutListener
	p = newCutListener(l, func(client net.Conn) {
		defer client.Close()
		upstream, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", target)
		if err != nil {
			return
		}
		// The upstream side is tracked with the client's, so a cut closes
		// both and neither end sees the other's data again.
		up := &trackedConn{Conn: upstream, l: p}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = upstream.Close()
			return
		}
		p.conns[up] = struct{}{}
		p.mu.Unlock()
		defer up.Close()
		done := make(chan struct{}, 2)
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			done <- struct{}{}
		}
		go pipe(up, client)
		go pipe(client, up)
		<-done
		<-done
	})
	go p.run()
	return p, nil
}
