package webhook

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
)

// CountDials wraps c's socket-level dial, so a test can prove that a refused
// target was never dialled at all.
func CountDials(c *Client) *atomic.Int64 {
	var n atomic.Int64
	inner := c.netDial
	c.netDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return inner(ctx, network, addr)
	}
	return &n
}

// RouteDials makes c's socket-level dial connect to target whatever address
// it was asked for, and returns the addresses it was asked for: a test can
// then deliver to a public address (as the client judged and chose it) and
// have the request answered by a server on loopback. It replaces the dialer
// that runs the Control hook, which tests call through Control.
func RouteDials(c *Client, target string) func() []string {
	var mu sync.Mutex
	var asked []string
	c.netDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		asked = append(asked, addr)
		mu.Unlock()
		return (&net.Dialer{}).DialContext(ctx, network, target)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), asked...)
	}
}

// Control runs c's dialer Control hook on address, as the socket would.
func Control(c *Client, address string) error { return c.control("tcp", address, nil) }

// Admit asks the endpoint's shared breaker whether an attempt may go now.
func Admit(ctx context.Context, d *Dispatcher, tenant string, endpointID uuid.UUID) (bool, error) {
	_, ok, err := d.admit(ctx, tenant, deliveryPayload{EndpointID: endpointID})
	return ok, err
}

// DispatcherLogger is the logger d reports through.
func DispatcherLogger(d *Dispatcher) *slog.Logger { return d.cfg.Logger }

// ReceiverLogger is the logger rc reports through.
func ReceiverLogger(rc *Receiver) *slog.Logger { return rc.cfg.Logger }

// PruneQueriesForTest returns the statements of Store.Prune and
// Pruner.Count, for plan checks.
func PruneQueriesForTest(s *Store) (prune, count string) {
	return s.sql.pruneDeliveries, s.sql.countDeliveries
}
