package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/erp"
	"github.com/llmq/llmq/examples/internal/sample"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/jobs"
)

// An upload of several documents is one batch: accepted in one call,
// idempotent per key, refused whole for bad input or a tenant's quota,
// its progress read through the API and seen on the event stream, and
// one signed webhook to the ERP when every extraction is finished.
func TestUploadIsOneBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, stackConfig{SmallQuota: 2})
	ctx := t.Context()
	streamCtx, closeStream := context.WithCancel(ctx)
	defer closeStream()
	events, err := f.big.stream(streamCtx, "")
	require.NoError(t, err)

	nordwind := suppliers[bigTenant][0]
	var docs []invoice.Document
	for i := range 7 {
		extra := plain
		if i == 4 {
			extra = wrongIBAN // needs review
		}
		docs = append(docs, f.upload(f.big, fmt.Sprintf("up-%d", i), sample.Invoice(nordwind, fmt.Sprintf("UP-%d", i), i, extra)))
	}

	// Bad input names the document at fault, and accepts nothing.
	bad := func(field string, docs []invoice.Document) {
		t.Helper()
		u, err := f.big.uploadBatch(ctx, "bad-"+field, docs)
		require.NoError(t, err)
		require.Equal(t, http.StatusUnprocessableEntity, u.Status, "%s", u.Body)
		require.Contains(t, string(u.Body), `"field":"`+field+`"`)
	}
	wrongDigest := append([]invoice.Document{}, docs...)
	wrongDigest[2].SHA256 = docs[1].SHA256
	bad("documents[2].sha256", wrongDigest)
	missing := append([]invoice.Document{}, docs...)
	missing[0].Version = 7
	bad("documents[0].version", missing)
	bad("documents[3]", append(append([]invoice.Document{}, docs[:3]...), docs[1]))
	bad("documents", nil)
	listed, err := f.s.svc.Jobs.List(ctx, f.s.pool, jobs.ListParams{Tenant: bigTenant})
	require.NoError(t, err)
	require.Empty(t, listed.Jobs, "a refused upload accepts nothing")

	// The small tenant's quota is 2 pending jobs: an upload of 3 is
	// refused whole.
	var small []invoice.Document
	for i := range 3 {
		small = append(small, f.upload(f.small, fmt.Sprintf("s-%d", i), sample.Invoice(suppliers[smallTenant][0], fmt.Sprintf("KK-%d", i), i, plain)))
	}
	over, err := f.small.uploadBatch(ctx, "small-upload", small)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, over.Status, "%s", over.Body)

	// Accepted: 202 with the jobs; again, 200 with the same batch; the key
	// with other documents, 409.
	up, err := f.big.uploadBatch(ctx, "upload-1", docs)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, up.Status, "%s", up.Body)
	require.Equal(t, up.Batch.StatusURL, up.Location)
	require.Len(t, up.Batch.Jobs, len(docs))
	require.Equal(t, invoice.BatchView{BatchID: up.Batch.BatchID, StatusURL: up.Location, Total: 7, CreatedAt: up.Batch.CreatedAt},
		withoutJobs(up.Batch))
	again, err := f.big.uploadBatch(ctx, "upload-1", docs)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, again.Status)
	require.Equal(t, up.Batch.BatchID, again.Batch.BatchID)
	require.Equal(t, up.Batch.Jobs, again.Batch.Jobs, "the same jobs: a client that lost the first answer learns them")
	conflict, err := f.big.uploadBatch(ctx, "upload-1", docs[:6])
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, conflict.Status)
	require.Contains(t, string(conflict.Body), `"field":"Idempotency-Key"`)
	status, job, err := f.big.get(ctx, up.Batch.Jobs[0].StatusURL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, up.Batch.BatchID, job.BatchID)
	require.Equal(t, docs[0], *job.Document)
	status, _, err = f.small.getBatch(ctx, up.Location)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status, "another tenant's upload is not found")

	// The stream shows the upload's progress as its jobs finish: one
	// cancelled before the worker starts, then the others.
	batchID := up.Batch.BatchID.String()
	var progress []int
	var completed []invoice.BatchNotification
	deadline := time.After(30 * time.Second)
	_, err = f.s.svc.Jobs.Cancel(ctx, f.s.pool, bigTenant, up.Batch.Jobs[6].JobID)
	require.NoError(t, err)
	for len(progress) == 0 {
		select {
		case ev := <-events:
			if ev.Event == "batch.progress" {
				progress = append(progress, ev.Batch.Finished)
				require.Equal(t, invoice.BatchNotification{Type: "batch.progress", BatchID: batchID, Total: 7, Finished: 1, Cancelled: 1, PercentDone: 14}, ev.Batch)
			}
		case <-deadline:
			t.Fatal("no progress on the stream after a cancel")
		}
	}
	f.s.run(ctx)
	for len(completed) == 0 {
		select {
		case ev := <-events:
			switch ev.Event {
			case "job.changed":
				require.Equal(t, batchID, ev.Data.BatchID, "each job event names the upload")
			case "batch.progress":
				require.Equal(t, batchID, ev.Batch.BatchID)
				progress = append(progress, ev.Batch.Finished)
			case "batch.completed":
				completed = append(completed, ev.Batch)
			}
		case <-deadline:
			t.Fatalf("the upload did not finish on the stream: progress %v, completed %v", progress, completed)
		}
	}
	require.IsIncreasing(t, progress, "progress only grows, and is sent when it does")
	require.LessOrEqual(t, progress[len(progress)-1], 7)
	require.Equal(t, invoice.BatchNotification{
		EventID: completed[0].EventID, Type: jobs.BatchCompletedEvent, BatchID: batchID, Done: true,
		Total: 7, Finished: 7, Succeeded: 5, ReviewRequired: 1, Cancelled: 1, PercentDone: 100,
	}, completed[0])

	status, view, err := f.big.getBatch(ctx, up.Location)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.True(t, view.Done)
	require.Equal(t, 100, view.PercentDone)
	require.Equal(t, [4]int{5, 1, 0, 1}, [4]int{view.Succeeded, view.ReviewRequired, view.Failed, view.Cancelled})
	require.False(t, view.FinishedAt.IsZero())

	// The ERP hears of the upload once, signed with the tenant's key (its
	// receiver refuses anything else), and books the five good invoices.
	var uploads []erp.Upload
	require.Eventually(t, func() bool {
		uploads, err = f.s.erp.Uploads(ctx)
		require.NoError(t, err)
		return len(uploads) > 0
	}, 30*time.Second, 20*time.Millisecond, "no upload webhook reached the ERP")
	require.Len(t, uploads, 1)
	require.Equal(t, erp.Upload{Tenant: bigTenant, BatchID: batchID, DeliveryID: uploads[0].DeliveryID, Total: 7, Succeeded: 5, ReviewRequired: 1, Cancelled: 1},
		uploads[0])
	var deliveries int
	require.NoError(t, f.s.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.s.schema+".webhook_deliveries WHERE event_type = $1",
		invoice.BatchCompletedEvent).Scan(&deliveries))
	require.Equal(t, 1, deliveries, "one webhook per upload and endpoint")
	require.Eventually(t, func() bool {
		inv, err := f.s.erp.Invoices(ctx)
		require.NoError(t, err)
		return len(inv) == 5
	}, 30*time.Second, 20*time.Millisecond)
}

func withoutJobs(v invoice.BatchView) invoice.BatchView {
	v.Jobs = nil
	return v
}
