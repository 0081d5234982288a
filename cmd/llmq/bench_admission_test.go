package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// One bench process, run in-process: it waits for the start signal (its
// stdin closing), makes its share of grants and reports them. (The whole
// mode re-executes the llmq binary, which a test binary is not.)
func TestBenchAdmissionWorker(t *testing.T) {
	t.Parallel()
	c := setup(t)
	_, pool := c.migrated()
	l, err := admission.NewPostgres(pool, admission.Config{Schema: c.schema})
	require.NoError(t, err)
	require.NoError(t, l.SetPool(t.Context(), benchAdmissionPool))

	var out bytes.Buffer
	err = benchAdmissionWorker(t.Context(), &common{databaseURL: dbtest.URL()}, benchOptions{jobs: 50, workers: 2}, c.schema, strings.NewReader(""), &out)
	require.NoError(t, err)
	line, rest, ok := strings.Cut(out.String(), "\n")
	require.True(t, ok)
	require.Equal(t, "ready", line)
	var share admissionShare
	require.NoError(t, json.Unmarshal([]byte(rest), &share))
	require.Equal(t, 50, share.Grants)
	require.Len(t, share.AcquireMS, 50)
	require.True(t, share.End.After(share.Start))
	inFlight, permits, err := l.Counts(t.Context(), benchAdmissionPool.Name)
	require.NoError(t, err)
	require.Zero(t, inFlight)
	require.Zero(t, permits)
}
