package invoice

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtest"
)

type workerFixture struct {
	t   *testing.T
	svc *Service
	job *jobs.Job
}

func setupWorker(t *testing.T) *workerFixture {
	t.Helper()
	db := llmqtest.NewDB(t)
	svc, err := New(db.Pool, Config{Schema: db.Schema, Auth: NewAuth(nil)})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(t.Context()))
	doc, err := svc.PutDocument(t.Context(), "acme", "inv.txt", ocr)
	require.NoError(t, err)
	require.NoError(t, svc.PutSupplier(t.Context(), "acme", *nordwind))
	payload, err := json.Marshal(Payload{Document: doc, Schema: SchemaV1, Policy: PolicyVersion, Model: Model})
	require.NoError(t, err)
	return &workerFixture{t: t, svc: svc, job: &jobs.Job{Tenant: "acme", Kind: Kind, Payload: payload}}
}

// work runs the handler once against a provider that answers with status,
// headers and body.
func (f *workerFixture) work(status int, header http.Header, body string) (json.RawMessage, error) {
	f.t.Helper()
	var requests atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer provider.Close()
	ex, err := newExtractor(f.svc, provider.URL+"/v1", "key", provider.Client())
	require.NoError(f.t, err)
	result, err := ex.Work(f.t.Context(), f.job)
	require.Equal(f.t, int32(1), requests.Load(), "one request per call: the SDK's retries are off")
	return result, err
}

// completion is a chat completion whose content is content, or its JSON
// when it is not a string.
func completion(content any) string {
	text, ok := content.(string)
	if !ok {
		c, err := json.Marshal(content)
		if err != nil {
			panic(err)
		}
		text = string(c)
	}
	b, err := json.Marshal(map[string]any{
		"choices": []map[string]any{{"message": map[string]string{"role": "assistant", "content": text}}},
		"usage":   map[string]int{"prompt_tokens": 100, "completion_tokens": 50},
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// How the handler classifies each kind of provider answer, as the runner will
// read it.
func TestProviderAnswers(t *testing.T) {
	t.Parallel()
	f := setupWorker(t)

	result, err := f.work(http.StatusOK, nil, completion(goodExtraction()))
	require.NoError(t, err)
	var r Result
	require.NoError(t, json.Unmarshal(result, &r))
	require.Equal(t, PolicyVersion, r.Policy)
	require.Empty(t, r.Findings)

	_, err = f.work(http.StatusTooManyRequests, http.Header{"Retry-After": {"7"}}, `{"error":{}}`)
	var snooze *jobs.SnoozeError
	require.ErrorAs(t, err, &snooze, "a 429 with a wait snoozes")
	require.Equal(t, 7*time.Second, snooze.After)

	_, err = f.work(http.StatusBadGateway, nil, "")
	class, _ := jobs.Classify(err)
	require.Equal(t, jobs.ClassTransient, class)

	_, err = f.work(http.StatusBadRequest, nil, `{"error":{"message":"bad"}}`)
	class, _ = jobs.Classify(err)
	require.Equal(t, jobs.ClassPermanent, class)

	_, err = f.work(http.StatusOK, nil, `not json`)
	var invalid *jobs.InvalidOutputError
	require.ErrorAs(t, err, &invalid)

	_, err = f.work(http.StatusOK, nil, completion(`{"supplier_name": `))
	require.ErrorAs(t, err, &invalid)
	require.JSONEq(t, `"{\"supplier_name\": "`, string(invalid.Output), "the malformed output is kept for a reviewer")

	wrong := goodExtraction()
	wrong.Total = "99.99"
	_, err = f.work(http.StatusOK, nil, completion(wrong))
	var review *jobs.ReviewError
	require.ErrorAs(t, err, &review)
	require.Contains(t, string(review.Result), `"rule":"arithmetic"`)
}

// The supplier lookup after a paid answer loses its connection: the handler
// reads again instead of failing the attempt, so the answer is kept and the
// provider is called once.
func TestPaidAnswerSurvivesALostLookup(t *testing.T) {
	t.Parallel()
	f := setupWorker(t)
	ctx := t.Context()
	// The provider's answer is written while a transaction holds the
	// supplier table, so the handler's lookup waits where it can be found.
	blocker, err := f.svc.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	var calls atomic.Int32
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, err := blocker.Exec(r.Context(), "LOCK TABLE "+pgx.Identifier{f.svc.cfg.Schema, "invoice_suppliers"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(completion(goodExtraction())))
	}))
	defer provider.Close()

	type outcome struct {
		result json.RawMessage
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		ex, err := newExtractor(f.svc, provider.URL+"/v1", "key", provider.Client())
		if err != nil {
			done <- outcome{nil, err}
			return
		}
		result, err := ex.Work(ctx, f.job)
		done <- outcome{result, err}
	}()
	waiting := func() int {
		var pid int
		require.NoError(t, f.svc.pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%invoice_suppliers%' AND pid <> pg_backend_pid()`).Scan(&pid))
		return pid
	}
	var pid int
	require.Eventually(t, func() bool { pid = waiting(); return pid != 0 }, 10*time.Second, 10*time.Millisecond, "the lookup never waited")
	_, err = f.svc.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	require.Eventually(t, func() bool { p := waiting(); return p != 0 && p != pid }, 10*time.Second, 10*time.Millisecond, "the lookup was not read again")
	require.NoError(t, blocker.Rollback(ctx))

	out := <-done
	require.NoError(t, out.err)
	require.Contains(t, string(out.result), `"invoice_number"`)
	require.Equal(t, int32(1), calls.Load(), "the paid answer was kept: one provider call")
}
