package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/llmq/llmq/console"
)

// runConsole serves the operator web console (package console) against
// -database-url and -schema until ctx ends. It has no authentication of
// its own: it listens on loopback by default, and a host that exposes it
// puts it behind its own auth (or mounts console.New in its own server).
func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c := newFlagSet("console", stderr)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on (host:port); keep it on loopback unless a proxy with auth is in front")
	tenant := fs.String("tenant", "", "show only this tenant's data (a tenant-scoped console)")
	actions := fs.Bool("actions", false, "enable actions: replay dead-lettered and REVIEW_REQUIRED jobs, change pool limits")
	actor := fs.String("actor", "", "who is recorded for actions (default: the OS user name)")
	origins := fs.String("trusted-origins", "", "comma-separated origins (https://ops.example.com) allowed to act when a proxy rewrites Host and the browser sends no Sec-Fetch-Site")
	secure := fs.Bool("secure-cookie", false, "mark the CSRF cookie Secure: set it when browsers reach the console over HTTPS through a TLS-terminating proxy")
	refresh := fs.Duration("refresh", console.DefaultRefreshInterval, "how often pages refresh their live parts (0: never)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		return fmt.Errorf("%w: console: -addr %q: %w", errInvalidInput, *addr, err)
	}
	if *refresh < 0 {
		return fmt.Errorf("%w: console: -refresh is %s; it must not be negative", errUsage, *refresh)
	}
	if *actions && *actor == "" {
		name, err := osUser()
		if err != nil {
			return fmt.Errorf("%w: console: -actor WHO is needed with -actions: %w", errUsage, err)
		}
		*actor = name
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	who := *actor
	interval := *refresh
	if interval == 0 {
		interval = -1
	}
	h, err := console.New(console.Config{DB: pool, Schema: c.schema, Tenant: *tenant, EnableActions: *actions,
		Actor: func(*http.Request) string { return who }, RefreshInterval: interval,
		TrustedOrigins: splitList(*origins), SecureCookie: *secure,
		Logger: slog.New(slog.NewTextHandler(stderr, nil))})
	if err != nil {
		return fmt.Errorf("%w: %w", errInvalidInput, err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", *addr)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "llmq console on http://%s/ (schema %s%s)\n", ln.Addr(), c.schema, map[bool]string{true: ", actions on as " + who, false: ", read-only"}[*actions])
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("console: shutting down: %w", err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
