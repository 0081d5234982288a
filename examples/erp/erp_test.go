package erp_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/erp"
	"github.com/llmq/llmq/llmqtest"
	"github.com/llmq/llmq/webhook"
)

type fixture struct {
	t   *testing.T
	erp *erp.ERP
	srv *httptest.Server
	key webhook.Key
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db := llmqtest.NewDB(t)
	e, err := erp.New(db.Pool, erp.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, e.Migrate(t.Context()))
	key := webhook.Key{ID: "k1", Secret: webhook.NewSecret()}
	require.NoError(t, e.AddTenant("acme", key))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return &fixture{t: t, erp: e, srv: srv, key: key}
}

// post sends body as delivery id, signed with key, and returns the status.
func (f *fixture) post(id string, body []byte, key webhook.Key) int {
	f.t.Helper()
	req, err := http.NewRequestWithContext(f.t.Context(), http.MethodPost, f.srv.URL+"/webhooks/acme", bytes.NewReader(body))
	require.NoError(f.t, err)
	req.Header = webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, id, time.Now(), body, false)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(f.t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func completed(jobID, number string) []byte {
	return []byte(`{"type":"invoice.extract.completed","timestamp":"2026-11-30T00:00:00Z","data":{"job_id":"` + jobID +
		`","result":{"policy":"invoice-policy/v1","extraction":{"supplier_name":"Nordwind","invoice_number":"` + number + `","currency":"EUR","total":"10.71"}}}}`)
}

// A delivery booked once stays booked once: the same delivery again is
// acknowledged without a second effect, and another delivery of the same
// invoice (a second extraction of a duplicate upload) leaves a receipt but
// books nothing.
func TestBooksOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.Equal(t, http.StatusNoContent, f.post("d1", completed("j1", "NW-1"), f.key))
	require.Equal(t, http.StatusOK, f.post("d1", completed("j1", "NW-1"), f.key))
	require.Equal(t, http.StatusNoContent, f.post("d2", completed("j2", "NW-1"), f.key))
	require.Equal(t, http.StatusConflict, f.post("d1", completed("j1", "NW-2"), f.key), "a reused id with another body is quarantined")

	inv, err := f.erp.Invoices(t.Context())
	require.NoError(t, err)
	require.Len(t, inv, 1)
	require.Equal(t, erp.Invoice{Tenant: "acme", Supplier: "Nordwind", InvoiceNumber: "NW-1", Currency: "EUR", Total: "10.71", JobID: "j1", DeliveryID: "d1"}, inv[0])
	c, err := f.erp.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, erp.Counts{Receipts: 2, Booked: 1, DigestMismatches: 1}, c)
}

// What the ERP refuses: a wrong signature (401), an extraction with
// findings (503: not booked, the sender retries and dead-letters it), and
// everything while it is down (503).
func TestRefuses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	other := webhook.Key{ID: "k1", Secret: webhook.NewSecret()}
	require.Equal(t, http.StatusUnauthorized, f.post("d1", completed("j1", "NW-1"), other))

	withFindings := []byte(`{"type":"invoice.extract.completed","data":{"job_id":"j2","result":{"findings":[{"field":"iban"}],"extraction":{"supplier_name":"N","invoice_number":"1","currency":"EUR","total":"1.00"}}}}`)
	require.Equal(t, http.StatusServiceUnavailable, f.post("d2", withFindings, f.key))

	f.erp.SetDown(true)
	require.Equal(t, http.StatusServiceUnavailable, f.post("d3", completed("j3", "NW-3"), f.key))
	f.erp.SetDown(false)
	require.Equal(t, http.StatusNoContent, f.post("d3", completed("j3", "NW-3"), f.key))

	c, err := f.erp.Counts(t.Context())
	require.NoError(t, err)
	require.Equal(t, erp.Counts{Receipts: 1, Booked: 1, RefusedDown: 1}, c)
}
