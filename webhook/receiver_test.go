package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/webhook"
)

// erp is a receiving service: a table of its own, written by the receiver's
// work in the inbox transaction.
type erp struct {
	f        *fixture
	key      webhook.Key
	srv      *httptest.Server
	down     atomic.Bool  // the work fails (503) while set
	runs     atomic.Int64 // the work's runs that committed or not
	mismatch atomic.Int64
	loseAcks atomic.Bool  // drop the answer to every delivery committed for the first time
	lostAcks atomic.Int64 // answers dropped
}

func newERP(t *testing.T, f *fixture, maxBody int64) *erp {
	t.Helper()
	_, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.schema+".erp_invoices (delivery_id text NOT NULL, body bytea NOT NULL)")
	require.NoError(t, err)
	e := &erp{f: f, key: webhook.Key{ID: "erp", Secret: webhook.NewSecret()}}
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{e.key}})
	require.NoError(t, err)
	rc, err := webhook.NewReceiver(webhook.ReceiverConfig{
		Verifier: v, Inbox: f.inbox, DB: f.pool, Consumer: "erp", MaxBodyBytes: maxBody,
		Handle: func(ctx context.Context, tx pgx.Tx, d webhook.Received) error {
			e.runs.Add(1)
			if e.down.Load() {
				return errors.New("ERP database unavailable")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+f.schema+".erp_invoices VALUES ($1, $2)", d.ID, d.Body)
			return err
		},
		OnDigestMismatch: func(context.Context, webhook.Received) { e.mismatch.Add(1) },
	})
	require.NoError(t, err)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.loseAcks.Load() {
			rc.ServeHTTP(w, r)
			return
		}
		// The receiver commits, then the connection drops before its answer
		// leaves: the sender cannot tell and must retry.
		rec := httptest.NewRecorder()
		rc.ServeHTTP(rec, r)
		if rec.Code == http.StatusNoContent {
			e.lostAcks.Add(1)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
				return
			}
		}
		w.WriteHeader(rec.Code)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *erp) post(t *testing.T, h http.Header, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL, strings.NewReader(body))
	require.NoError(t, err)
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

func (e *erp) rows(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.f.pool.Query(t.Context(), "SELECT delivery_id, count(*) FROM "+e.f.schema+".erp_invoices GROUP BY 1")
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func TestReceiverAcceptsOnceAndAnswersAfterCommit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	e := newERP(t, f, 1024)
	body := `{"type":"invoice.extract.completed","data":{"invoice":"inv-1"}}`
	sign := func(id string, at time.Time, b string) http.Header {
		return webhook.Sign(webhook.SchemeStandard, []webhook.Key{e.key}, id, at, []byte(b), false)
	}
	now := time.Now()

	require.Equal(t, http.StatusNoContent, e.post(t, sign("d1", now, body), body))
	require.Equal(t, map[string]int{"d1": 1}, e.rows(t))
	require.Equal(t, http.StatusOK, e.post(t, sign("d1", now.Add(time.Second), body), body), "a redelivery is acknowledged")
	require.Equal(t, int64(1), e.runs.Load(), "and its work does not run again")

	other := `{"type":"invoice.extract.completed","data":{"invoice":"inv-2"}}`
	require.Equal(t, http.StatusConflict, e.post(t, sign("d1", now, other), other), "same id, other body")
	require.Equal(t, int64(1), e.mismatch.Load(), "alerted")
	q, err := f.inbox.ListQuarantined(t.Context(), f.pool, "erp", 10)
	require.NoError(t, err)
	require.Len(t, q, 1, "and quarantined")

	e.down.Store(true)
	require.Equal(t, http.StatusServiceUnavailable, e.post(t, sign("d2", now, body), body), "the work failed: retry")
	e.down.Store(false)
	require.Equal(t, http.StatusNoContent, e.post(t, sign("d2", now, body), body), "nothing of the failed try remained")
	require.Equal(t, map[string]int{"d1": 1, "d2": 1}, e.rows(t))

	cases := []struct {
		name   string
		header http.Header
		body   string
		want   int
	}{
		{"tampered body", sign("d3", now, body), strings.Replace(body, "inv-1", "inv-9", 1), http.StatusUnauthorized},
		{"stale timestamp", sign("d3", now.Add(-10*time.Minute), body), body, http.StatusUnauthorized},
		{"future timestamp", sign("d3", now.Add(10*time.Minute), body), body, http.StatusUnauthorized},
		{"wrong key", webhook.Sign(webhook.SchemeStandard, []webhook.Key{{ID: "erp", Secret: webhook.NewSecret()}}, "d3", now, []byte(body), false), body, http.StatusUnauthorized},
		{"no headers", http.Header{}, body, http.StatusBadRequest},
		{"id with a control character", sign("d\t3", now, body), body, http.StatusBadRequest},
		{"oversize body", sign("d3", now, strings.Repeat("x", 2048)), strings.Repeat("x", 2048), http.StatusRequestEntityTooLarge},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, e.post(t, tc.header, tc.body), tc.name)
	}
	require.Equal(t, map[string]int{"d1": 1, "d2": 1}, e.rows(t), "nothing refused was processed")

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.srv.URL, bytes.NewReader(nil))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}
