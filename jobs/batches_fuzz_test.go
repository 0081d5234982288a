package jobs_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// FuzzParseBatchCompleted checks that a payload either fails to parse or
// gives a finished batch whose counts add up, and that what parses comes
// back the same through the JSON the store writes.
//
//	go test -run '^$' -fuzz FuzzParseBatchCompleted ./jobs
func FuzzParseBatchCompleted(f *testing.F) {
	for _, seed := range []string{
		`{"batch_id":"0b7f5f3e-4c1a-4d0e-9a57-2f1c8e6b9d10","tenant":"acme","batch_key":"upload-2","total":5,"succeeded":1,"review_required":0,"failed":3,"cancelled":1}`,
		`{"batch_id":"0b7f5f3e-4c1a-4d0e-9a57-2f1c8e6b9d10","tenant":"acme","total":2,"succeeded":3,"failed":-1}`,
		`{"batch_id":"00000000-0000-0000-0000-000000000000","tenant":"acme","total":1,"succeeded":1}`,
		`{"tenant":"","total":0}`, `[]`, `null`, `{"total":1e3}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := jobs.ParseBatchCompleted(payload)
		if err != nil {
			require.Nil(t, b)
			return
		}
		require.True(t, b.Done())
		require.NotEmpty(t, b.Tenant)
		require.Equal(t, b.Total, b.Succeeded+b.ReviewRequired+b.Failed+b.Cancelled)
		require.True(t, b.CreatedAt.IsZero() && b.FinishedAt.IsZero(), "the event carries neither time")

		again, err := json.Marshal(map[string]any{"batch_id": b.ID, "tenant": b.Tenant, "batch_key": b.Key, "total": b.Total,
			"succeeded": b.Succeeded, "review_required": b.ReviewRequired, "failed": b.Failed, "cancelled": b.Cancelled})
		require.NoError(t, err)
		round, err := jobs.ParseBatchCompleted(again)
		require.NoError(t, err)
		require.Equal(t, b, round)
	})
}

func TestParseBatchCompletedNamesTheField(t *testing.T) {
	t.Parallel()
	for payload, field := range map[string]string{
		`{"tenant":"acme","total":1,"succeeded":1}`:                                                               "batch_id",
		`{"batch_id":"0b7f5f3e-4c1a-4d0e-9a57-2f1c8e6b9d10","total":1,"succeeded":1}`:                             "tenant",
		`{"batch_id":"0b7f5f3e-4c1a-4d0e-9a57-2f1c8e6b9d10","tenant":"acme","total":0}`:                           "total",
		`{"batch_id":"0b7f5f3e-4c1a-4d0e-9a57-2f1c8e6b9d10","tenant":"acme","total":2,"succeeded":1}`:             "add up to 1, not to total 2",
		`{"batch_id":"0b7f5f3e-4c1a-4d0e-9a57-2f1c8e6b9d10","tenant":"acme","total":1,"succeeded":2,"failed":-1}`: "must not be negative",
		`{"batch_id":"not a uuid"}`: "batch.completed payload",
	} {
		_, err := jobs.ParseBatchCompleted([]byte(payload))
		require.ErrorContains(t, err, field, payload)
	}
}
