package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

// The whole path: an extraction succeeds, its OnSucceeded hook enqueues a
// webhook delivery in the same commit, the runner delivers it signed, and the
// ERP's Receiver books it once.
func ExampleStore_Enqueue() {
	ctx := context.Background()
	const schema = "llmq_example_webhook_enqueue"
	pool, cleanup := migratedForExample(ctx, schema) // a pool on DATABASE_URL and a fresh, migrated schema
	defer cleanup()
	jobStore := must(jobs.NewStore(jobs.Config{Schema: schema, Queues: []string{jobs.DefaultQueue, webhook.DefaultQueue}}))
	outboxStore := must(outbox.NewStore(outbox.Config{Schema: schema}))
	inboxStore := must(inbox.NewStore(inbox.Config{Schema: schema}))

	// The ERP's side (in the same database here, for brevity).
	secret := webhook.NewSecret()
	booked := make(chan string, 1)
	receiver := must(webhook.NewReceiver(webhook.ReceiverConfig{
		Verifier: must(webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{{ID: "erp", Secret: secret}}})),
		Inbox:    inboxStore, DB: pool, Consumer: "erp",
		Handle: func(_ context.Context, _ pgx.Tx, d webhook.Received) error {
			var body struct {
				Type string          `json:"type"`
				Data json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(d.Body, &body); err != nil {
				return err
			}
			booked <- body.Type + " " + string(body.Data)
			return nil
		},
	}))
	erp := httptest.NewServer(receiver)
	defer erp.Close()

	// llmq's side. Loopback and plain http are allowed only because the ERP
	// of this example is a local test server.
	local := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	hooks := must(webhook.NewStore(webhook.Config{Schema: schema, Jobs: jobStore, Outbox: outboxStore, AllowHTTP: true, Allow: local}))
	if _, _, err := hooks.RegisterEndpoint(ctx, pool, webhook.EndpointParams{
		Tenant: "acme", URL: erp.URL, EventTypes: []string{"invoice.extract.completed"}, Secret: secret,
	}); err != nil {
		panic(err)
	}
	client := must(webhook.NewClient(webhook.ClientConfig{AllowHTTP: true, Allow: local}))
	dispatcher := must(hooks.NewDispatcher(pool, webhook.DispatcherConfig{Client: client}))
	runner := must(lease.NewRunner(pool, jobStore, lease.Config{
		Handlers: map[string]lease.Handler{
			"invoice.extract": lease.HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) {
				return json.RawMessage(`{"total":"42.00"}`), nil // the model call
			}),
			webhook.Kind: dispatcher,
		},
		Queues:      map[string]lease.QueueConfig{jobs.DefaultQueue: {}, webhook.DefaultQueue: {}},
		RetryByKind: map[string]llmqtype.BackoffPolicy{webhook.Kind: webhook.Backoff()},
		OnSucceeded: func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
			if job.Kind != "invoice.extract" {
				return nil
			}
			_, err := hooks.Enqueue(ctx, tx, job.Tenant, webhook.Event{ID: job.ID.String(), Type: "invoice.extract.completed", Payload: job.Result})
			return err
		},
	}))

	if _, err := jobStore.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract", Payload: json.RawMessage(`{"document":"doc-1"}`)}); err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(runCtx) }()
	select {
	case b := <-booked:
		fmt.Println("ERP booked:", b)
	case <-time.After(30 * time.Second):
		fmt.Println("nothing arrived")
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output:
	// ERP booked: invoice.extract.completed {"total":"42.00"}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// migratedForExample reserves schema on DATABASE_URL and migrates it.
func migratedForExample(ctx context.Context, schema string) (*pgxpool.Pool, func()) {
	pool, cleanup := dbtest.ForExample(ctx, schema)
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema}); err != nil {
		cleanup()
		panic(err)
	}
	return pool, cleanup
}
