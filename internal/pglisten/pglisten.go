// Package pglisten keeps a LISTEN connection open, for the lease runner and
// the outbox relay, which wake on Postgres notifications.
//
// It listens on a set of channels over a dedicated connection,
// re-establishes it with backoff when it drops, and tells the caller after
// each (re)connect, since notifications sent while disconnected are lost.
package pglisten

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Run listens on channels until ctx ends. notify is called for every
// notification; connected after every successful (re)connect, so the caller
// can look for work it may have missed.
func Run(ctx context.Context, cfg *pgx.ConnConfig, channels []string, notify func(channel, payload string), connected func(), logger *slog.Logger) {
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		err := listenOnce(ctx, cfg, channels, notify, connected)
		if ctx.Err() != nil {
			return
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
		logger.Warn("llmq: LISTEN connection lost; polling until it is back", "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func listenOnce(ctx context.Context, cfg *pgx.ConnConfig, channels []string, notify func(channel, payload string), connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		notify(n.Channel, n.Payload)
	}
}
