// Package serve runs the examples' HTTP servers until their context ends.
package serve

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// HTTP serves h on addr until ctx ends, then shuts down, giving requests in
// flight up to grace to finish. It returns nil after a clean shutdown.
func HTTP(ctx context.Context, addr string, h http.Handler, grace time.Duration) error {
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
