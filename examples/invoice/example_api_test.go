package invoice_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/llmqtest"
)

// Accepting an extraction: store the document version, then submit it under
// an Idempotency-Key. A retry of the same request is the same job; the key
// reused for another document is a conflict.
func Example() {
	ctx := context.Background()
	const schema = "invoice_example_api"
	pool, err := pgxpool.New(ctx, llmqtest.URL()) // DATABASE_URL, or the local default
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	dropSchema := func() { // a fresh schema, dropped again at the end
		if _, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			panic(err)
		}
	}
	dropSchema()
	defer dropSchema()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: schema}); err != nil {
		panic(err)
	}
	svc, err := invoice.New(pool, invoice.Config{
		Schema: schema,
		Auth:   invoice.NewAuth(map[string]invoice.Credential{"tok-acme": {Tenant: "acme"}}),
	})
	if err != nil {
		panic(err)
	}
	if err := svc.Migrate(ctx); err != nil {
		panic(err)
	}
	api := httptest.NewServer(svc.Handler())
	defer api.Close()

	call := func(method, path, key, body string) (int, map[string]any) {
		req, err := http.NewRequestWithContext(ctx, method, api.URL+path, strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Authorization", "Bearer tok-acme")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	job := func(doc map[string]any) string {
		return fmt.Sprintf(`{"document":{"name":%q,"version":%v,"sha256":%q},"schema":"invoice-v1"}`, doc["name"], doc["version"], doc["sha256"])
	}

	status, doc1 := call(http.MethodPut, "/documents/inv-1.txt", "", "Supplier: Nordwind\nTotal: 10.71\n")
	fmt.Println("PUT document:", status, "version", doc1["version"])
	_, doc2 := call(http.MethodPut, "/documents/inv-2.txt", "", "Supplier: Acme\nTotal: 99.00\n")

	status, first := call(http.MethodPost, "/extraction-jobs", "upload-1", job(doc1))
	fmt.Println("submit:", status, first["state"])
	status, again := call(http.MethodPost, "/extraction-jobs", "upload-1", job(doc1))
	fmt.Println("same key, same request:", status, "same job:", again["job_id"] == first["job_id"])
	status, conflict := call(http.MethodPost, "/extraction-jobs", "upload-1", job(doc2))
	apiErr, _ := conflict["error"].(map[string]any)
	fmt.Println("same key, another document:", status, apiErr["field"])
	// Output:
	// PUT document: 201 version 1
	// submit: 202 READY
	// same key, same request: 200 same job: true
	// same key, another document: 409 Idempotency-Key
}
