package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// A bench whose jobs cannot all succeed says why instead of waiting for
// ever: a job that ended otherwise, or no job finishing for a while (a
// runner retrying a claim that keeps failing, say).
func TestBenchWaitSaysWhy(t *testing.T) {
	t.Parallel()
	newBench := func() (*bench, *bytes.Buffer) {
		var progress bytes.Buffer
		return &bench{o: benchOptions{jobs: 10, workers: 2}, progress: &lockedWriter{w: &progress}, unfinished: make(chan error, 1)}, &progress
	}

	t.Run("a job that did not succeed", func(t *testing.T) {
		t.Parallel()
		b, _ := newBench()
		b.afterRecord(&jobs.Job{ID: uuid.New(), State: jobs.StateSucceeded}, nil)
		b.afterRecord(&jobs.Job{ID: uuid.New(), State: jobs.StateRetryScheduled}, nil) // it may still succeed
		b.afterRecord(&jobs.Job{ID: uuid.New(), State: jobs.StateFailedTerminal, LastError: "the handler broke"}, nil)
		_, err := b.waitDone(t.Context())
		require.ErrorContains(t, err, "ended FAILED_TERMINAL, not SUCCEEDED: the handler broke")
	})

	t.Run("no job finishing", func(t *testing.T) {
		t.Parallel()
		b, progress := newBench()
		b.stallAfter = 50 * time.Millisecond
		for range 3 {
			b.afterRecord(&jobs.Job{ID: uuid.New(), State: jobs.StateSucceeded}, nil)
		}
		b.afterRecord(nil, jobs.ErrLeaseLost)
		b.afterRecord(nil, jobs.ErrLeaseLost)
		_, err := b.waitDone(t.Context())
		require.ErrorContains(t, err, "no job finished for 50ms; 3 of 10 jobs done")
		require.Equal(t, 1, bytes.Count(progress.Bytes(), []byte("an outcome was not recorded")), "said once: %s", progress)
		require.Contains(t, progress.String(), jobs.ErrLeaseLost.Error())
	})
}
