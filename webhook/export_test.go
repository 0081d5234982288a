package webhook

import (
	"context"
	"net"
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

// Control runs c's dialer Control hook on address, as the socket would.
func Control(c *Client, address string) error { return c.control("tcp", address, nil) }

// Admit asks the endpoint's shared breaker whether an attempt may go now.
func Admit(ctx context.Context, d *Dispatcher, tenant string, endpointID uuid.UUID) (bool, error) {
	_, ok, err := d.admit(ctx, tenant, deliveryPayload{EndpointID: endpointID})
	return ok, err
}
