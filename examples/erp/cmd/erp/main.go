// Command erp serves the example ERP's webhook receiver: POST
// /webhooks/{tenant}, verified with each tenant's secret (as printed by
// `invoice -mode register-endpoint`), booked once per invoice, and its
// Prometheus metrics on GET /metrics.
//
//	erp -addr 127.0.0.1:8070 -secrets acme=whsec_...
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/examples/erp"
	"github.com/llmq/llmq/examples/internal/serve"
	"github.com/llmq/llmq/webhook"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8070", "listen address")
	databaseURL := flag.String("database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL")
	schema := flag.String("schema", "erp", "Postgres schema of the ERP's tables and inbox")
	secrets := flag.String("secrets", os.Getenv("ERP_SECRETS"), "tenant=secret[,tenant=secret...]")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, *addr, *databaseURL, *schema, *secrets)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "erp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, databaseURL, schema, secrets string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema}); err != nil {
		return err
	}
	mp, metrics, err := serve.Metrics()
	if err != nil {
		return err
	}
	e, err := erp.New(pool, erp.Config{Schema: schema, MeterProvider: mp})
	if err != nil {
		return err
	}
	if err := e.Migrate(ctx); err != nil {
		return err
	}
	for entry := range strings.SplitSeq(secrets, ",") {
		if entry == "" {
			continue
		}
		tenant, secret, ok := strings.Cut(entry, "=")
		raw, err := webhook.ParseSecret(secret)
		if !ok || tenant == "" || err != nil {
			return fmt.Errorf("-secrets: entry for %q is not tenant=whsec_<base64>", tenant)
		}
		if err := e.AddTenant(tenant, webhook.Key{ID: "k1", Secret: raw}); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.Handle("/", e)
	fmt.Println("erp listening on", addr)
	return serve.HTTP(ctx, serve.NewServer(addr, mux, serve.Limits{}), 5*time.Second)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
