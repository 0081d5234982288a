// Command invoice runs the invoice-extraction service of package invoice:
//
//	invoice -mode api    -addr :8080 -tokens tok-acme=acme,tok-ops=acme:operator
//	invoice -mode worker -provider-url http://127.0.0.1:8090/v1 -rpm 600 -tpm 1000000 -metrics-addr :9091
//	invoice -mode worker -provider-url http://127.0.0.1:8091/v1 -rpm 1000000 -tpm 1000000000 -in-flight-tokens 200000  # a local server
//	invoice -mode register-endpoint -tenant acme -url https://erp.example.com/webhooks/acme
//	invoice -mode put-supplier -tenant acme -name "Nordwind Papier GmbH" -iban DE89370400440532013000
//	invoice -mode worker -provider-url http://127.0.0.1:8090/v1 -rpm 600 -tpm 1000000 \
//	        -fallback-url http://127.0.0.1:8092 -fallback-model claude-haiku-4-5 -fallback-pool anthropic -fallback-rpm 300 -fallback-tpm 500000
//	invoice -drill primary-outage [-fault storm|outage|none] [-fault-for 30s]
//
// With -fallback-url the worker routes extractions (lease.Route): the
// provider of -provider-url first, in OpenAI's dialect, then the fallback
// in Anthropic's (its server root, without /v1), under a pool of its own.
//
// -drill primary-outage runs the primary-outage drill (package
// ../../drill) in this process against a fake provider, in the schema
// -drill-schema (dropped and recreated): it prints its figures and exits
// 1 if a target was missed, naming it.
//
// Every mode migrates the schema first (safe from every replica). The API and
// the worker are separate processes sharing the database; run as many of
// each as needed. A worker also runs the outbox relay that sends each
// upload's webhook (one worker's relay holds the lease, the others stand
// by; -relay=false leaves it to another process). register-endpoint
// subscribes the endpoint to completed extractions and finished uploads
// and prints the signing secret once. The API serves Prometheus metrics on
// /metrics; the worker on -metrics-addr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/internal/serve"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/examples/invoice/drill"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

type options struct {
	mode, addr, metricsAddr, databaseURL string
	schema, tokens                       string
	providerURL, apiKey, pool            string
	rpm, workers, maxInFlight            int
	tpm, inFlightTokens                  int64
	tenant, url, name, iban              string
	allowLoopback, relay                 bool

	fallbackURL, fallbackKey, fallbackPool, fallbackModel string
	fallbackRPM                                           int
	fallbackTPM                                           int64

	drill, fault, drillSchema string
	faultFor, warmup, after   time.Duration
	scale                     float64
	primaryRPM                int
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "api", "api, worker, register-endpoint or put-supplier")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "API listen address")
	flag.StringVar(&o.metricsAddr, "metrics-addr", "", "listen address of /metrics, e.g. 127.0.0.1:9091 (worker)")
	flag.StringVar(&o.databaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL")
	flag.StringVar(&o.schema, "schema", invoice.DefaultSchema, "Postgres schema")
	flag.StringVar(&o.tokens, "tokens", envOr("INVOICE_TOKENS", ""), "bearer tokens: token=tenant[:operator],...")
	flag.StringVar(&o.providerURL, "provider-url", "", "OpenAI-compatible base URL, e.g. http://127.0.0.1:8090/v1 (worker)")
	flag.StringVar(&o.apiKey, "api-key", os.Getenv("PROVIDER_API_KEY"), "provider API key (worker)")
	flag.StringVar(&o.pool, "pool", "provider", "admission pool: the quota all workers share (worker)")
	flag.IntVar(&o.rpm, "rpm", 0, "the pool's requests per minute; 0 keeps the stored limits (worker)")
	flag.Int64Var(&o.tpm, "tpm", 0, "the pool's tokens per minute (worker)")
	flag.IntVar(&o.maxInFlight, "max-in-flight", 0, "the pool's concurrent calls; default -workers (worker)")
	flag.Int64Var(&o.inFlightTokens, "in-flight-tokens", 0, "the tokens the pool's calls in flight may reserve together, for a local inference server's KV cache; 0: no limit (worker)")
	flag.IntVar(&o.workers, "workers", 10, "extractions in flight in this process (worker)")
	flag.StringVar(&o.tenant, "tenant", "", "tenant (register-endpoint, put-supplier)")
	flag.StringVar(&o.name, "name", "", "supplier name (put-supplier)")
	flag.StringVar(&o.iban, "iban", "", "supplier IBAN (put-supplier)")
	flag.StringVar(&o.url, "url", "", "endpoint URL (register-endpoint)")
	flag.BoolVar(&o.allowLoopback, "allow-loopback", false, "allow plain-http loopback webhook endpoints (local runs only)")
	flag.BoolVar(&o.relay, "relay", true, "run the outbox relay that sends upload webhooks (worker)")
	flag.StringVar(&o.fallbackURL, "fallback-url", "", "a fallback provider in Anthropic's Messages API, its root URL without /v1, e.g. http://127.0.0.1:8092: extractions route to it when the primary cannot serve (worker)")
	flag.StringVar(&o.fallbackKey, "fallback-api-key", os.Getenv("FALLBACK_API_KEY"), "the fallback provider's API key (worker)")
	flag.StringVar(&o.fallbackPool, "fallback-pool", "fallback", "the fallback's admission pool (worker)")
	flag.StringVar(&o.fallbackModel, "fallback-model", "", "the fallback's model (worker, with -fallback-url)")
	flag.IntVar(&o.fallbackRPM, "fallback-rpm", 0, "the fallback pool's requests per minute; 0 keeps the stored limits (worker; with -drill, the fallback model's quota, default 600)")
	flag.Int64Var(&o.fallbackTPM, "fallback-tpm", 0, "the fallback pool's tokens per minute (worker)")
	flag.StringVar(&o.drill, "drill", "", "run a drill instead of a mode: primary-outage")
	flag.StringVar(&o.fault, "fault", "storm", "the drill's fault on the primary model: storm (429 with Retry-After), outage (503) or none")
	flag.DurationVar(&o.faultFor, "fault-for", 30*time.Second, "how long the drill's fault lasts")
	flag.DurationVar(&o.warmup, "warmup", 10*time.Second, "the drill's healthy phase before the fault")
	flag.DurationVar(&o.after, "after", 15*time.Second, "the drill's phase after the primary healed")
	flag.Float64Var(&o.scale, "scale", 50, "the drill's fake provider latency divisor (15s / scale)")
	flag.IntVar(&o.primaryRPM, "primary-rpm", 3000, "the drill's primary model quota and pool RPM")
	flag.StringVar(&o.drillSchema, "drill-schema", "invoice_drill", "the drill's Postgres schema, dropped and recreated")
	flag.Parse()
	workersSet := false
	flag.Visit(func(f *flag.Flag) { workersSet = workersSet || f.Name == "workers" })
	if o.drill != "" && !workersSet {
		o.workers = 0 // the drill's default
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	var err error
	if o.drill != "" {
		err = runDrill(ctx, o)
	} else {
		err = run(ctx, o)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "invoice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	auth, err := parseTokens(o.tokens)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: o.schema}); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	svc, err := invoice.New(pool, invoice.Config{Schema: o.schema, Auth: auth, AllowLoopback: o.allowLoopback, Logger: logger})
	if err != nil {
		return err
	}
	if err := svc.Migrate(ctx); err != nil {
		return err
	}
	mp, metrics, err := serve.Metrics()
	if err != nil {
		return err
	}
	switch o.mode {
	case "api":
		gauges, err := svc.Jobs.RegisterGauges(pool, jobs.GaugeConfig{MeterProvider: mp})
		if err != nil {
			return err
		}
		defer func() { _ = gauges.Unregister() }()
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics)
		mux.Handle("/", svc.Handler())
		logger.Info("API listening", "addr", o.addr)
		// The grace is for acceptances in flight; event streams never
		// finish, so they are cut when it runs out (clients reconnect with
		// Last-Event-ID). The streams lift the write timeout for
		// themselves and keep their connections alive.
		return serve.HTTP(ctx, serve.NewServer(o.addr, mux, serve.Limits{}), 10*time.Second)
	case "worker":
		var fallback *invoice.Fallback
		if o.fallbackURL != "" {
			fallback = &invoice.Fallback{
				ProviderURL: o.fallbackURL, APIKey: o.fallbackKey, Pool: o.fallbackPool, Model: o.fallbackModel,
				Limits: admission.Pool{RPM: o.fallbackRPM, TPM: o.fallbackTPM, MaxInFlight: max(o.maxInFlight, o.workers)},
			}
		}
		runner, err := svc.NewRunner(ctx, invoice.WorkerConfig{
			ProviderURL: o.providerURL, APIKey: o.apiKey, Pool: o.pool, Workers: o.workers, Logger: logger,
			Limits:        admission.Pool{RPM: o.rpm, TPM: o.tpm, MaxInFlight: max(o.maxInFlight, o.workers), MaxInFlightTokens: o.inFlightTokens},
			Fallback:      fallback,
			MeterProvider: mp,
		})
		if err != nil {
			return err
		}
		if o.metricsAddr != "" {
			go func() {
				if err := serve.HTTP(ctx, serve.NewServer(o.metricsAddr, metrics, serve.Limits{}), time.Second); err != nil {
					logger.Error("metrics server failed", "addr", o.metricsAddr, "err", err)
				}
			}()
			logger.Info("metrics listening", "addr", o.metricsAddr)
		}
		logger.Info("worker running", "id", runner.WorkerID(), "provider", o.providerURL)
		if !o.relay {
			return runner.Run(ctx)
		}
		relay, err := svc.NewEventRelay(nil, outbox.RelayConfig{Logger: logger, MeterProvider: mp})
		if err != nil {
			return err
		}
		return runBoth(ctx, runner.Run, relay.Run)
	case "register-endpoint":
		ep, key, err := svc.Webhooks.RegisterEndpoint(ctx, pool, webhook.EndpointParams{
			Tenant: o.tenant, URL: o.url, EventTypes: []string{invoice.CompletedEvent, invoice.BatchCompletedEvent},
		})
		if err != nil {
			return err
		}
		fmt.Printf("endpoint %s for %s: key id %s, secret %s (shown once)\n", ep.ID, o.tenant, key.ID, webhook.FormatSecret(key.Secret))
		return nil
	case "put-supplier":
		if o.tenant == "" || o.name == "" || o.iban == "" {
			return errors.New("put-supplier needs -tenant, -name and -iban")
		}
		return svc.PutSupplier(ctx, o.tenant, invoice.Supplier{Name: o.name, IBAN: o.iban})
	}
	return fmt.Errorf("unknown -mode %q: api, worker, register-endpoint or put-supplier", o.mode)
}

// runDrill runs the drill -drill names in a fresh schema and prints its
// figures; a missed target is an error naming it.
func runDrill(ctx context.Context, o options) error {
	if o.drill != "primary-outage" {
		return fmt.Errorf("unknown -drill %q: primary-outage", o.drill)
	}
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{o.drillSchema}.Sanitize()+" CASCADE"); err != nil {
		return err
	}
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: o.drillSchema}); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load average before the drill: %s", load)
	f, err := drill.Run(ctx, drill.Config{
		Pool: pool, Schema: o.drillSchema, Fault: o.fault, Warmup: o.warmup, FaultFor: o.faultFor, After: o.after,
		Scale: o.scale, PrimaryRPM: o.primaryRPM, FallbackRPM: o.fallbackRPM, Workers: o.workers, Logger: logger,
	})
	if err != nil {
		return err
	}
	fmt.Print(f)
	if misses := f.Misses(); len(misses) > 0 {
		return fmt.Errorf("the drill missed %d target(s):\n  %s", len(misses), strings.Join(misses, "\n  "))
	}
	fmt.Println("every target met")
	return nil
}

// runBoth runs a and b until ctx ends or either returns, which stops the
// other, and returns what they returned.
func runBoth(ctx context.Context, a, b func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	for _, run := range []func(context.Context) error{a, b} {
		go func() {
			err := run(ctx)
			cancel()
			errs <- err
		}()
	}
	return errors.Join(<-errs, <-errs)
}

// parseTokens reads "token=tenant[:operator],...".
func parseTokens(s string) (*invoice.Auth, error) {
	tokens := map[string]invoice.Credential{}
	for entry := range strings.SplitSeq(s, ",") {
		if entry == "" {
			continue
		}
		token, rest, ok := strings.Cut(entry, "=")
		tenant, role, _ := strings.Cut(rest, ":")
		if !ok || token == "" || tenant == "" || (role != "" && role != "operator") {
			return nil, fmt.Errorf("-tokens: %q is not token=tenant or token=tenant:operator", entry)
		}
		tokens[token] = invoice.Credential{Tenant: tenant, Operator: role == "operator"}
	}
	return invoice.NewAuth(tokens), nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
