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
// synchronous call gets for the same answer. The same bytes needed as late
// under another name take that result, sent in no batch, with a webhook of
// their own. A document needed sooner is extracted synchronously, under its
// deadline.
func TestBatchLane(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t)
	svc, err := New(db.Pool, Config{Schema: db.Schema, Auth: NewAuth(map[string]Credential{apiToken: {Tenant: "acme"}}), AllowLoopback: true, BatchLane: true})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(t.Context()))
	doc, err := svc.PutDocument(t.Context(), "acme", "inv.txt", ocr)
	require.NoError(t, err)
	copyDoc, err := svc.PutDocument(t.Context(), "acme", "copy-of-inv.txt", ocr)
	require.NoError(t, err)
	require.NoError(t, svc.PutSupplier(t.Context(), "acme", *nordwind))
	_, _, err = svc.Webhooks.RegisterEndpoint(t.Context(), db.Pool, webhook.EndpointParams{Tenant: "acme", URL: "http://127.0.0.1:1/hook", EventTypes: []string{CompletedEvent}})
	require.NoError(t, err)
	api := httptest.NewServer(svc.Handler())
	t.Cleanup(api.Close)
	f := &apiFixture{t: t, svc: svc, srv: api, db: db}

	accept := func(key string, doc Document, neededBy time.Time) *jobs.Job {
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
	deferred := accept("later", doc, later)
	require.Equal(t, BatchQueue, deferred.Queue)
	require.WithinDuration(t, later, deferred.DeadlineAt, time.Second)
	copied := accept("later-copy", copyDoc, later)
	soon := accept("soon", doc, time.Now().Add(2*time.Hour))
	require.Equal(t, Queue, soon.Queue, "needed sooner than the batch window: synchronous")
	require.False(t, soon.DeadlineAt.IsZero())

	fake := fakeprovider.New(fakeprovider.Config{BatchDelay: time.Nanosecond, MeanLatency: time.Millisecond, RPM: 100_000})
	provider := httptest.NewServer(fake)
	t.Cleanup(provider.Close)
	submitter, err := svc.NewBatchSubmitter(BatchConfig{ProviderURL: provider.URL + "/v1", APIKey: "key",
		GatherInterval: time.Nanosecond, PollMin: time.Nanosecond, PollMax: time.Nanosecond})
	require.NoError(t, err)
	var done, copyDone *jobs.Job
	for range 100 {
		require.NoError(t, submitter.Pass(t.Context()))
		done, err = svc.Jobs.Get(t.Context(), db.Pool, "acme", deferred.ID)
		require.NoError(t, err)
		copyDone, err = svc.Jobs.Get(t.Context(), db.Pool, "acme", copied.ID)
		require.NoError(t, err)
		if done.State.Terminal() && copyDone.State.Terminal() {
			break
		}
	}
	require.Equal(t, jobs.StateSucceeded, done.State, done.LastError)
	require.Equal(t, int64(1), fake.Stats().BatchesCreated)
	require.Equal(t, int64(1), fake.Stats().BatchRequestsAnswered, "the copy was sent in no batch")
	require.Zero(t, fake.Stats().Calls, "no synchronous call")
	require.Equal(t, jobs.StateSucceeded, copyDone.State, copyDone.LastError)
	require.Equal(t, deferred.ID, copyDone.ReusedFrom)
	require.JSONEq(t, string(done.Result), string(copyDone.Result))
	attempts, err := svc.Jobs.Attempts(t.Context(), db.Pool, "acme", deferred.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, submitter.Worker(), attempts[0].Worker)
	attempts, err = svc.Jobs.Attempts(t.Context(), db.Pool, "acme", copied.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Equal(t, jobs.AttemptReused, attempts[0].Outcome)

	ex, err := newExtractor(svc, provider.URL+"/v1", "key", provider.Client())
	require.NoError(t, err)
	syncResult, err := ex.Work(t.Context(), deferred)
	require.NoError(t, err)
	require.JSONEq(t, string(syncResult), string(done.Result), "the batch lane's result is the synchronous path's")

	var deliveries int
	require.NoError(t, db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+db.Schema+".jobs WHERE kind = $1", webhook.Kind).Scan(&deliveries))
	require.Equal(t, 2, deliveries, "each success's webhook delivery, enqueued with it, the reused one's too")
	soonNow, err := svc.Jobs.Get(t.Context(), db.Pool, "acme", soon.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StateReady, soonNow.State, "the submitter does not touch the synchronous queue")
}
