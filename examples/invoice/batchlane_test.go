package invoice

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtest"
	"github.com/llmq/llmq/webhook"
)

// A document needed two days from now goes through the provider's batch
// API: its job waits in BatchQueue, the batch submitter sends it, and the
// answer is parsed and checked as the worker's would be, with its webhook
// delivery enqueued in the same transaction. Its result is the one a
// synchronous call gets for the same answer. A document needed sooner is
// extracted synchronously, under its deadline.
func TestBatchLane(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t)
	svc, err := New(db.Pool, Config{Schema: db.Schema, Auth: NewAuth(map[string]Credential{apiToken: {Tenant: "acme"}}), AllowLoopback: true, BatchLane: true})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(t.Context()))
	doc, err := svc.PutDocument(t.Context(), "acme", "inv.txt", ocr)
	require.NoError(t, err)
	require.NoError(t, svc.PutSupplier(t.Context(), "acme", *nordwind))
	_, _, err = svc.Webhooks.RegisterEndpoint(t.Context(), db.Pool, webhook.EndpointParams{Tenant: "acme", URL: "http://127.0.0.1:1/hook", EventTypes: []string{CompletedEvent}})
	require.NoError(t, err)
	api := httptest.NewServer(svc.Handler())
	t.Cleanup(api.Close)
	f := &apiFixture{t: t, svc: svc, srv: api, db: db}

	accept := func(key string, neededBy time.Time) *jobs.Job {
		body := fmt.Appendf(nil, `{"document":{"name":%q,"version":%d,"sha256":%q},"schema":"invoice-v1","needed_by":%q}`,
			doc.Name, doc.Version, doc.SHA256, neededBy.UTC().Format(time.RFC3339))
		a := f.call(http.MethodPost, "/extraction-jobs", http.Header{"Idempotency-Key": {key}}, body)
		require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
		var v JobView
		require.NoError(t, json.Unmarshal(a.body, &v))
		job, err := svc.Jobs.Get(t.Context(), db.Pool, "acme", v.JobID)
		require.NoError(t, err)
		return job
	}
	later := time.Now().Add(48 * time.Hour)
	deferred := accept("later", later)
	require.Equal(t, BatchQueue, deferred.Queue)
	require.WithinDuration(t, later, deferred.DeadlineAt, time.Second)
	soon := accept("soon", time.Now().Add(2*time.Hour))
	require.Equal(t, Queue, soon.Queue, "needed sooner than the batch window: synchronous")
	require.False(t, soon.DeadlineAt.IsZero())

	fake := fakeprovider.New(fakeprovider.Config{BatchDelay: time.Nanosecond, MeanLatency: time.Millisecond, RPM: 100_000})
	provider := httptest.NewServer(fake)
	t.Cleanup(provider.Close)
	submitter, err := svc.NewBatchSubmitter(BatchConfig{ProviderURL: provider.URL + "/v1", APIKey: "key",
		GatherInterval: time.Nanosecond, PollMin: time.Nanosecond, PollMax: time.Nanosecond})
	require.NoError(t, err)
	var done *jobs.Job
	for range 100 {
		require.NoError(t, submitter.Pass(t.Context()))
		if done, err = svc.Jobs.Get(t.Context(), db.Pool, "acme", deferred.ID); err == nil && done.State.Terminal() {
			break
		}
	}
	require.NoError(t, err)
	require.Equal(t, jobs.StateSucceeded, done.State, done.LastError)
	require.Equal(t, int64(1), fake.Stats().BatchesCreated)
	require.Zero(t, fake.Stats().Calls, "no synchronous call")
	attempts, err := svc.Jobs.Attempts(t.Context(), db.Pool, "acme", deferred.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, submitter.Worker(), attempts[0].Worker)

	ex, err := newExtractor(svc, provider.URL+"/v1", "key", provider.Client())
	require.NoError(t, err)
	syncResult, err := ex.Work(t.Context(), deferred)
	require.NoError(t, err)
	require.JSONEq(t, string(syncResult), string(done.Result), "the batch lane's result is the synchronous path's")

	var deliveries int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+db.Schema+".jobs WHERE kind = $1", webhook.Kind).Scan(&deliveries))
	require.Equal(t, 1, deliveries, "the success's webhook delivery, enqueued with it")
	soonNow, err := svc.Jobs.Get(t.Context(), db.Pool, "acme", soon.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateReady, soonNow.State, "the submitter does not touch the synchronous queue")
}
