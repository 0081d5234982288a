package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/webhook"
)

// A receiving service (an ERP) mounts a Receiver: it verifies the signature,
// records the delivery id in its inbox and does its work in one transaction,
// and answers 2xx only after the commit. A redelivery is acknowledged without
// doing the work again.
func ExampleReceiver() {
	ctx := context.Background()
	const schema = "llmq_example_webhook_receiver"
	pool, cleanup := migratedForExample(ctx, schema) // a pool on DATABASE_URL and a fresh, migrated schema
	defer cleanup()
	in, err := inbox.NewStore(inbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	key := webhook.Key{ID: "erp", Secret: webhook.NewSecret()} // the secret the endpoint was registered with
	verifier, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}})
	if err != nil {
		panic(err)
	}
	receiver, err := webhook.NewReceiver(webhook.ReceiverConfig{
		Verifier: verifier, Inbox: in, DB: pool, Consumer: "erp",
		Handle: func(ctx context.Context, tx pgx.Tx, d webhook.Received) error {
			fmt.Println("booking", d.ID) // ... the ERP's own writes, on tx ...
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(receiver)
	defer srv.Close()

	body := `{"type":"invoice.extract.completed","timestamp":"2026-01-02T03:04:05Z","data":{"invoice":"inv-1"}}`
	for range 2 { // the second is a retry of the same delivery
		h := webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, "01a229d8-delivery", time.Now(), []byte(body), false)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		_ = resp.Body.Close()
		fmt.Println(resp.Status)
	}
	// Output:
	// booking 01a229d8-delivery
	// 204 No Content
	// 200 OK
}
