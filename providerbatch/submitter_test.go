package providerbatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	oai "github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/providerbatch"
)

// Jobs waiting in the batch queue go out in one provider batch and each
// result completes its job as an attempt of the submitter: the result
// the synchronous path makes of the same answer, the answer's usage, one
// attempt row each.
func TestSubmitterServesJobsThroughOneBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	texts := make([]string, 30)
	for i := range texts {
		texts[i] = invoice(i, "")
	}
	ids := h.enqueue(texts...)
	s := h.submitter(h.cfg)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))

	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated, "30 jobs of one model within the limits: one batch")
	require.Zero(t, h.fake.Stats().Calls, "no synchronous call")

	// The synchronous path, through the same Call, for the first document.
	handler := extractCall.Handle(func(ctx context.Context, req oai.ChatCompletionNewParams) (*oai.ChatCompletion, error) {
		client := h.client()
		return client.Chat.Completions.New(ctx, req)
	})
	first := h.job(ids[0])
	syncResult, err := handler.Handler.Work(t.Context(), first)
	require.NoError(t, err)
	require.JSONEq(t, string(syncResult), string(first.Result), "the batch path's result is the synchronous path's")

	for _, id := range ids {
		attempts := h.attempts(id)
		require.Len(t, attempts, 1)
		a := attempts[0]
		require.Equal(t, jobs.AttemptSucceeded, a.Outcome)
		require.Equal(t, s.Worker(), a.Worker)
		require.Equal(t, "providerbatch:"+pool, a.Worker)
		require.Positive(t, a.Usage.InputTokens)
		require.Positive(t, a.Usage.OutputTokens)
	}

	subs := h.submissions()
	require.Len(t, subs, 1)
	sub := subs[0]
	require.Equal(t, "ended", sub.State)
	require.Equal(t, "completed", sub.ProviderStatus)
	require.Equal(t, "gpt-test", sub.Model)
	require.Equal(t, [5]int{30, 0, 0, 0, 0}, [5]int{sub.Succeeded, sub.Failed, sub.Stale, sub.Returned, sub.Skipped})
	require.Equal(t, 30, sub.Requests)
	require.NotEmpty(t, sub.ProviderBatchID)
	require.False(t, sub.EndedAt.IsZero())
}

// What a gather claims is split within the provider's limits before it
// is sent, never refused by the provider: requests per batch, bytes per
// batch (Config.Limits) and the enqueued-token limit, which holds later
// jobs back until earlier batches end.
func TestSubmitterSplitsWithinTheLimits(t *testing.T) {
	t.Parallel()
	t.Run("requests", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, fakeprovider.Config{OpenAIBatchMaxRequests: 7})
		texts := make([]string, 30)
		for i := range texts {
			texts[i] = invoice(i, "")
		}
		h.enqueue(texts...)
		cfg := h.cfg
		cfg.Limits.MaxRequests = 7
		h.passUntil(h.submitter(cfg), "all succeeded", h.allIn(jobs.StateSucceeded, 30))
		st := h.fake.Stats()
		require.Equal(t, int64(5), st.BatchesCreated, "30 requests, 7 a batch")
		require.Zero(t, st.BatchesRefused)
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, fakeprovider.Config{OpenAIBatchMaxFileBytes: 4 << 10})
		texts := make([]string, 20)
		for i := range texts {
			texts[i] = invoice(i, strings.Repeat("x", 200))
		}
		h.enqueue(texts...)
		cfg := h.cfg
		cfg.Limits.MaxBytes = 4 << 10
		h.passUntil(h.submitter(cfg), "all succeeded", h.allIn(jobs.StateSucceeded, 20))
		st := h.fake.Stats()
		require.Greater(t, st.BatchesCreated, int64(1))
		require.Zero(t, st.BatchesRefused)
		for _, sub := range h.submissions() {
			require.LessOrEqual(t, sub.Bytes, int64(4<<10))
		}
	})
	t.Run("enqueued tokens", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, fakeprovider.Config{OpenAIEnqueuedTokenLimit: 2_000})
		h.fake.HoldBatches()
		texts := make([]string, 10)
		for i := range texts {
			texts[i] = invoice(i, strings.Repeat("x", 1_600)) // about 450 tokens: four fit
		}
		ids := h.enqueue(texts...)
		cfg := h.cfg
		cfg.Provider = h.batches(2_000)
		s := h.submitter(cfg)
		h.passUntil(s, "one batch out", func() bool { return h.fake.Stats().BatchesCreated == 1 })
		for range 3 {
			require.NoError(t, s.Pass(t.Context()))
		}
		require.Equal(t, int64(1), h.fake.Stats().BatchesCreated, "no second batch while the first holds the limit")
		waiting := h.states()[jobs.StateReady] + h.states()[jobs.StateRetryScheduled]
		require.Positive(t, waiting, "jobs past the limit wait")
		h.fake.ReleaseBatches()
		h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
		require.Greater(t, h.fake.Stats().BatchesCreated, int64(1))
		require.Zero(t, h.fake.Stats().BatchesRefused)
		for _, id := range ids {
			for _, a := range h.attempts(id) {
				require.NotEqual(t, jobs.AttemptRetryScheduled, a.Outcome, "waiting on the limit is not a failed attempt")
			}
		}
	})
}

// A job cancelled while in a batch ends CANCELLED at the next poll; its
// result, when the batch ends, is never applied, but it is in the usage
// ledger, once: the provider billed it.
func TestSubmitterNeverAppliesTheResultOfACancelledJob(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	h.fake.HoldBatches()
	ids := h.enqueue(invoice(1, ""), invoice(2, ""))
	s := h.submitter(h.cfg)
	h.passUntil(s, "submitted", func() bool { return h.states()[jobs.StateRunning] == 2 && h.fake.Stats().BatchesCreated == 1 })
	_, err := h.store.Cancel(t.Context(), h.db.Pool, "acme", ids[0])
	require.NoError(t, err)
	h.passUntil(s, "cancelled", func() bool { return h.job(ids[0]).State == jobs.StateCancelled })
	h.fake.ReleaseBatches()
	h.passUntil(s, "ended", func() bool { return h.submissions()[0].State == "ended" })

	cancelled := h.job(ids[0])
	require.Equal(t, jobs.StateCancelled, cancelled.State)
	require.Empty(t, cancelled.Result)
	require.Equal(t, jobs.StateSucceeded, h.job(ids[1]).State)
	sub := h.submissions()[0]
	require.Equal(t, 1, sub.Succeeded)
	require.Equal(t, 1, sub.Stale+sub.Failed, "the cancelled job's item is settled without its result")

	// The provider billed both results: both are in the usage ledger, once
	// each, however often the results are read.
	billed := func() int64 {
		var n int64
		require.NoError(t, h.db.Pool.QueryRow(t.Context(), "SELECT coalesce(sum(batch_attempts), 0) FROM "+h.db.Schema+".admission_usage").Scan(&n))
		return n
	}
	require.Equal(t, int64(2), billed())
	_, err = h.db.Pool.Exec(t.Context(), "UPDATE "+h.db.Schema+".provider_submissions SET state = 'submitted', ended_at = NULL, next_poll_at = now()")
	require.NoError(t, err)
	h.passUntil(s, "ended again", func() bool { return h.submissions()[0].State == "ended" })
	require.Equal(t, int64(2), billed(), "read again, billed once")
}

// A job whose deadline comes before the provider's window could end is
// not sent: it fails with class "deadline" and says why.
func TestSubmitterFailsAJobWhoseDeadlineIsTooSoon(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	res, err := extractKind.Enqueue(t.Context(), h.store, h.db.Pool, "acme", docArgs{Text: invoice(1, "")},
		jobs.EnqueueOptions{Queue: batchQueue, DeadlineAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	s := h.submitter(h.cfg)
	h.passUntil(s, "failed", h.allIn(jobs.StateFailedTerminal, 1))
	j := h.job(res.Job.ID)
	require.Equal(t, jobs.ClassDeadline, j.ErrorClass)
	require.Contains(t, j.LastError, "sooner than the provider batch window")
	require.Zero(t, h.fake.Stats().BatchesCreated)
}

// A SyncQueue the store does not know refuses the move: the late job
// fails with class deadline, as without one, and is not left leased.
func TestSubmitterFailsALateJobItCannotMove(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	late, err := extractKind.Enqueue(t.Context(), h.store, h.db.Pool, "acme", docArgs{Text: invoice(1, "")},
		jobs.EnqueueOptions{Queue: batchQueue, DeadlineAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	cfg := h.cfg
	cfg.SyncQueue = "nowhere"
	h.passUntil(h.submitter(cfg), "failed", h.allIn(jobs.StateFailedTerminal, 1))
	j := h.job(late.Job.ID)
	require.Equal(t, jobs.ClassDeadline, j.ErrorClass)
	require.Equal(t, batchQueue, j.Queue)
}

// With a SyncQueue, a job whose deadline leaves no room for a batch is
// handed to it instead of failing: enqueued too late, or returned by an
// expired batch once its time has grown short. A runner of that queue
// makes the same Call synchronously, and the result is the one the batch
// path would have made.
func TestSubmitterMovesALateJobToTheSyncQueue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	late, err := extractKind.Enqueue(t.Context(), h.store, h.db.Pool, "acme", docArgs{Text: invoice(1, "")},
		jobs.EnqueueOptions{Queue: batchQueue, DeadlineAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	ids := h.enqueue(invoice(2, ""), invoice(3, ""))
	cfg := h.cfg
	cfg.SyncQueue = jobs.DefaultQueue
	h.fake.HoldBatches()
	s := h.submitter(cfg)
	h.passUntil(s, "submitted", func() bool { return len(h.submissions()) == 1 })
	moved := h.job(late.Job.ID)
	require.Equal(t, jobs.DefaultQueue, moved.Queue)
	require.Equal(t, jobs.StateRetryScheduled, moved.State)
	a := h.attempts(late.Job.ID)
	require.Len(t, a, 1)
	require.Equal(t, jobs.AttemptSnoozed, a[0].Outcome)
	require.Contains(t, a[0].Error, `moved to the synchronous queue "default"`)
	require.Equal(t, 2, h.submissions()[0].Requests, "the late job is not in the batch")

	// The batch expires; by then the jobs' time has grown short.
	_, err = h.db.Pool.Exec(t.Context(), "UPDATE "+h.db.Schema+".jobs SET deadline_at = now() + interval '2 hours' WHERE queue = $1", batchQueue)
	require.NoError(t, err)
	require.Equal(t, 1, h.fake.ExpireBatches())
	h.passUntil(s, "all moved", func() bool {
		for _, id := range ids {
			if h.job(id).Queue != jobs.DefaultQueue {
				return false
			}
		}
		return true
	})
	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated, "not sent in a second batch")

	runner, err := lease.NewRunner(h.db.Pool, h.store, lease.Config{
		Handlers: lease.Kinds(extractCall.Handle(func(ctx context.Context, req oai.ChatCompletionNewParams) (*oai.ChatCompletion, error) {
			client := h.client()
			return client.Chat.Completions.New(ctx, req)
		})),
		PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()
	require.Eventually(t, h.allIn(jobs.StateSucceeded, 3), 20*time.Second, 20*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	require.Equal(t, int64(3), h.fake.Stats().Calls, "each served synchronously")
	for _, id := range append(ids, late.Job.ID) {
		require.Equal(t, jobs.StateSucceeded, h.job(id).State)
	}
}

// An operator's cancel reaches the provider at the next poll; the
// requests it did not run return to waiting and go out again.
func TestOperatorCancelsASubmission(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	h.fake.HoldBatches()
	ids := h.enqueue(invoice(1, ""), invoice(2, ""))
	s := h.submitter(h.cfg)
	h.passUntil(s, "submitted", func() bool { return h.fake.Stats().BatchesCreated == 1 && h.submissions()[0].State == "submitted" })
	op, err := providerbatch.NewOperator(h.db.Schema)
	require.NoError(t, err)
	first := h.submissions()[0].ID
	require.NoError(t, op.Cancel(t.Context(), h.db.Pool, first))
	require.True(t, h.submissions()[0].CancelRequested)
	h.passUntil(s, "ended", func() bool {
		for _, sub := range h.submissions() {
			if sub.ID == first {
				return sub.State == "ended"
			}
		}
		return false
	})
	require.Equal(t, int64(2), h.fake.Stats().BatchRequestsCancelled)
	require.ErrorIs(t, op.Cancel(t.Context(), h.db.Pool, first), providerbatch.ErrNotFound, "an ended submission")
	require.ErrorIs(t, op.Cancel(t.Context(), h.db.Pool, uuid.New()), providerbatch.ErrNotFound)
	h.fake.ReleaseBatches()
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
}

// Two submitters of one pool: one holds the lease and works, the other
// stands by; every job is sent once.
func TestOneSubmitterWorksAPool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueue(invoice(1, ""), invoice(2, ""), invoice(3, ""))
	a := h.submitter(h.cfg)
	cfgB := h.cfg
	cfgB.ID = "submitter-b"
	b := h.submitter(cfgB)
	h.passUntil(a, "all succeeded", func() bool {
		require.NoError(t, b.Pass(t.Context()))
		return h.allIn(jobs.StateSucceeded, len(ids))()
	})
	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated)
	var holder string
	require.NoError(t, h.db.Pool.QueryRow(t.Context(), "SELECT holder FROM "+h.db.Schema+".provider_batch_leases WHERE pool = $1", pool).Scan(&holder))
	require.Equal(t, "submitter-a", holder)
}

// A result applied twice changes nothing: a submission read again (as
// after a crash before it was marked ended) finds its items settled.
func TestSubmitterAppliesAResultOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueue(invoice(1, ""), invoice(2, ""))
	s := h.submitter(h.cfg)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
	before := h.submissions()[0]
	_, err := h.db.Pool.Exec(t.Context(), "UPDATE "+h.db.Schema+".provider_submissions SET state = 'submitted', ended_at = NULL, next_poll_at = now()")
	require.NoError(t, err)
	h.passUntil(s, "ended again", func() bool { return h.submissions()[0].State == "ended" })
	after := h.submissions()[0]
	require.Equal(t, before.Succeeded, after.Succeeded)
	for _, id := range ids {
		require.Len(t, h.attempts(id), 1)
	}
	var billed int64
	require.NoError(t, h.db.Pool.QueryRow(t.Context(), "SELECT coalesce(sum(batch_attempts), 0) FROM "+h.db.Schema+".admission_usage").Scan(&billed))
	require.Equal(t, int64(len(ids)), billed, "the usage ledger holds each result once")
}

// A submitter that created a provider batch but did not record its id
// (the create's answer was lost) adopts it at the next pass rather than
// send the submission again.
func TestSubmitterAdoptsABatchItDidNotRecord(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueue(invoice(1, ""), invoice(2, ""))
	cfg := h.cfg
	lost := &loseCreate{Provider: cfg.Provider, lose: 1}
	cfg.Provider = lost
	s := h.submitter(cfg)
	require.NoError(t, s.Pass(t.Context()))
	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated)
	require.Equal(t, "preparing", h.submissions()[0].State)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
	require.Equal(t, int64(1), h.fake.Stats().BatchesCreated, "adopted, not sent again")
}

// loseCreate creates the batch at the provider and then reports a failure,
// as a create whose answer was lost does, lose times.
type loseCreate struct {
	providerbatch.Provider
	lose int
}

func (l *loseCreate) Create(ctx context.Context, b providerbatch.Batch) (string, error) {
	id, err := l.Provider.Create(ctx, b)
	if err != nil || l.lose == 0 {
		return id, err
	}
	l.lose--
	return "", errors.New("the connection was reset after the request was sent")
}

// A Config that cannot work is refused at construction, naming its field.
func TestNewSubmitterRefusesABadConfig(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	for field, mutate := range map[string]func(*providerbatch.Config){
		"Pool":          func(c *providerbatch.Config) { c.Pool = "" },
		"Queue":         func(c *providerbatch.Config) { c.Queue = "" },
		"Provider":      func(c *providerbatch.Config) { c.Provider = nil },
		"Calls":         func(c *providerbatch.Config) { c.Calls = nil },
		"Calls[1]":      func(c *providerbatch.Config) { c.Calls = append(c.Calls, extractCall.Batch()) },
		"Calls[0]":      func(c *providerbatch.Config) { c.Calls = []providerbatch.KindCall{{}} },
		"LeaseDuration": func(c *providerbatch.Config) { c.LeaseDuration = time.Millisecond },
		"PollMax":       func(c *providerbatch.Config) { c.PollMin, c.PollMax = time.Minute, time.Second },
		"Window":        func(c *providerbatch.Config) { c.Window = -time.Hour },
		"Limits":        func(c *providerbatch.Config) { c.Limits.MaxBytes = -1 },
		"SyncQueue":     func(c *providerbatch.Config) { c.SyncQueue = c.Queue },
	} {
		cfg := h.cfg
		mutate(&cfg)
		_, err := providerbatch.NewSubmitter(h.db.Pool, h.store, cfg)
		require.ErrorIs(t, err, providerbatch.ErrInvalidConfig, field)
		var v *llmqtype.ValidationError
		require.ErrorAs(t, err, &v, field)
		require.Equal(t, field, v.Field)
	}
}

// Result lines that cannot be read are counted as skipped and logged;
// the rest of the batch applies.
func TestSubmitterSkipsUnreadableResultLines(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueue(invoice(1, ""), invoice(2, ""))
	cfg := h.cfg
	cfg.Provider = &extraLines{Provider: cfg.Provider, lines: []providerbatch.Result{
		{Problem: "not a JSON result line"},
		{CustomID: uuid.NewString(), Body: json.RawMessage(`{}`)},
		{CustomID: "x", Problem: "an unknown status"},
	}}
	h.passUntil(h.submitter(cfg), "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
	sub := h.submissions()[0]
	require.Equal(t, 2, sub.Succeeded)
	require.Equal(t, 2, sub.Skipped)
}

// extraLines adds lines before a batch's own results.
type extraLines struct {
	providerbatch.Provider
	lines []providerbatch.Result
}

func (e *extraLines) Results(ctx context.Context, id string, fn func(providerbatch.Result) error) error {
	for _, l := range e.lines {
		if err := fn(l); err != nil {
			return err
		}
	}
	return e.Provider.Results(ctx, id, fn)
}

// A request the provider refused fails its job; one it failed is retried
// into a later batch; an answer the parser rejects is invalid output, as
// on the synchronous path: tried once more, then sent to review. None
// stops the others.
func TestSubmitterMapsRequestErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	ids := h.enqueue(invoice(1, ""), invoice(2, "[[fake:batch-400]]"), invoice(3, "[[fake:batch-500]]"), invoice(4, "[[fake:malformed]]"))
	cfg := h.cfg
	cfg.Retry = llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond}
	s := h.submitter(cfg)
	h.passUntil(s, "all finished", func() bool {
		st := h.states()
		return st[jobs.StateSucceeded]+st[jobs.StateFailedTerminal]+st[jobs.StateReviewRequired] == len(ids)
	})
	ok, refused, failed, malformed := h.job(ids[0]), h.job(ids[1]), h.job(ids[2]), h.job(ids[3])
	require.Equal(t, jobs.StateSucceeded, ok.State)

	require.Equal(t, jobs.StateFailedTerminal, refused.State)
	require.Equal(t, jobs.ClassPermanent, refused.ErrorClass)
	require.Contains(t, refused.LastError, "HTTP 400")
	require.Len(t, h.attempts(ids[1]), 1, "a refused request is not sent again")

	require.Equal(t, jobs.StateFailedTerminal, failed.State)
	require.Equal(t, jobs.ClassTransient, failed.ErrorClass)
	require.Len(t, h.attempts(ids[2]), 3, "a failed request is retried, in later batches, up to MaxAttempts")

	require.Equal(t, jobs.StateReviewRequired, malformed.State)
	require.Equal(t, jobs.ClassInvalidOutput, malformed.ErrorClass)
	require.Len(t, h.attempts(ids[3]), 2, "the first invalid answer is retried, the second goes to review")
}

// An expired provider batch returns its unfinished jobs to waiting, the
// attempt not counted; a later batch serves them.
func TestSubmitterReturnsTheJobsOfAnExpiredBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	h.fake.HoldBatches()
	ids := h.enqueue(invoice(1, ""), invoice(2, ""), invoice(3, ""))
	s := h.submitter(h.cfg)
	h.passUntil(s, "submitted", func() bool { return len(h.submissions()) == 1 && h.submissions()[0].State == "submitted" })
	expired := h.submissions()[0].ID
	versions := func() string {
		var v string
		require.NoError(t, h.db.Pool.QueryRow(t.Context(), "SELECT string_agg(xmin::text, ',' ORDER BY id) FROM "+h.db.Schema+".jobs").Scan(&v))
		return v
	}
	before := versions()
	for range 5 {
		require.NoError(t, s.Pass(t.Context()))
	}
	require.Equal(t, before, versions(), "polls of a running batch write no job row")
	require.Equal(t, 5, h.submission(expired).Polls)
	require.Equal(t, 1, h.fake.ExpireBatches())
	h.passUntil(s, "returned", func() bool { return h.submission(expired).State == "ended" })
	require.Equal(t, 3, h.submission(expired).Returned)
	require.Equal(t, "expired", h.submission(expired).ProviderStatus)
	for _, id := range ids {
		j := h.job(id)
		require.Contains(t, []jobs.State{jobs.StateReady, jobs.StateRetryScheduled, jobs.StateRunning}, j.State)
	}
	h.fake.ReleaseBatches()
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))
	require.Equal(t, int64(2), h.fake.Stats().BatchesCreated)
	for _, id := range ids {
		a := h.attempts(id)
		require.Len(t, a, 2)
		require.Equal(t, jobs.AttemptSnoozed, a[0].Outcome)
		require.Equal(t, jobs.AttemptSucceeded, a[1].Outcome)
		require.Equal(t, 4, h.job(id).MaxAttempts, "an expired batch's attempt is not counted against MaxAttempts (3)")
	}
}

// The usage ledger holds a batch result at the pool's batch price: with
// the price left at zero, half the synchronous one. The same documents
// served synchronously, released through the limiter as a runner does,
// cost twice as much. A tenant's daily-cost quota counts the batch spend.
func TestBatchUsageCostsHalfInTheLedger(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{RPM: 100_000})
	limiter, err := admission.NewPostgres(h.db.Pool, admission.Config{Schema: h.db.Schema})
	require.NoError(t, err)
	require.NoError(t, limiter.SetPool(t.Context(), admission.Pool{
		Name: pool, RPM: 10_000, TPM: 10_000_000, MaxInFlight: 10,
		InputPrice: 2_500_000, OutputPrice: 10_000_000, // $2.50 and $10 a million tokens
	}))
	texts := make([]string, 40)
	for i := range texts {
		texts[i] = invoice(i, strings.Repeat("line item\n", i))
	}
	ids := h.enqueue(texts...)
	s := h.submitter(h.cfg)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))

	// The same documents, synchronously, under the tenant "sync".
	client := h.client()
	for _, text := range texts {
		req, err := buildExtract(t.Context(), nil, docArgs{Text: text})
		require.NoError(t, err)
		permit, err := limiter.Acquire(t.Context(), admission.Request{Pool: pool, Tenant: "sync", Tokens: 1_000})
		require.NoError(t, err)
		answer, err := client.Chat.Completions.New(t.Context(), req)
		require.NoError(t, err)
		require.NoError(t, permit.Release(t.Context(), admission.CallOutcome{
			Result: admission.CallAnswered, InputTokens: answer.Usage.PromptTokens, OutputTokens: answer.Usage.CompletionTokens,
		}))
	}

	today := time.Now().UTC()
	usage := func(tenant string) admission.Usage {
		rows, err := limiter.Usage(t.Context(), tenant, today, today)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		return rows[0]
	}
	batch, sync := usage("acme"), usage("sync")
	require.Equal(t, int64(len(ids)), batch.Attempts)
	require.Equal(t, int64(len(ids)), batch.BatchAttempts)
	require.Zero(t, sync.BatchAttempts)
	require.Equal(t, sync.InputTokens, batch.InputTokens, "the batch served the same requests")
	require.Equal(t, sync.OutputTokens, batch.OutputTokens)
	require.Positive(t, sync.Cost)
	require.InEpsilon(t, 0.5, float64(batch.Cost)/float64(sync.Cost), 0.01, "batch %d, sync %d micro-units", batch.Cost, sync.Cost)
	require.Equal(t, batch.Cost, batch.BatchCost, "all of it batch spend")
	require.Zero(t, sync.BatchCost)

	var attemptsIn int64
	for _, id := range ids {
		attemptsIn += h.attempts(id)[0].Usage.InputTokens
	}
	require.Equal(t, attemptsIn, batch.InputTokens, "the ledger holds the attempts' usage")

	// A tenant's daily-cost quota counts the batch spend: a limit just
	// above it admits, one at it refuses.
	quotas, err := admission.NewQuotas(admission.QuotaConfig{Schema: h.db.Schema})
	require.NoError(t, err)
	guarded, err := jobs.NewStore(jobs.Config{Schema: h.db.Schema, Queues: []string{batchQueue}, OnAccept: quotas.Hook()})
	require.NoError(t, err)
	require.NoError(t, quotas.SetTenantQuota(t.Context(), h.db.Pool, "acme", admission.TenantQuota{MaxDailyCost: batch.Cost + 1}))
	admitted, err := guarded.Enqueue(t.Context(), h.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: extractKind.Name(), Queue: batchQueue})
	require.NoError(t, err)
	_, err = h.store.Cancel(t.Context(), h.db.Pool, "acme", admitted.Job.ID)
	require.NoError(t, err)
	require.NoError(t, quotas.SetTenantQuota(t.Context(), h.db.Pool, "acme", admission.TenantQuota{MaxDailyCost: batch.Cost}))
	_, err = guarded.Enqueue(t.Context(), h.db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: extractKind.Name(), Queue: batchQueue})
	var over *admission.QuotaError
	require.ErrorAs(t, err, &over, "the batch spend reached the tenant's daily cost")
	require.NoError(t, quotas.DeleteTenantQuota(t.Context(), h.db.Pool, "acme"))

	// A batch price set on the pool is used as it is.
	state, err := limiter.State(t.Context(), pool)
	require.NoError(t, err)
	p := state.Pool
	p.BatchInputPrice, p.BatchOutputPrice = 2_500_000, 10_000_000
	require.NoError(t, limiter.SetPool(t.Context(), p))
	more := h.enqueue(texts...)
	h.passUntil(s, "the second lot succeeded", h.allIn(jobs.StateSucceeded, len(ids)+len(more)))
	batch = usage("acme")
	require.Equal(t, int64(2*len(ids)), batch.BatchAttempts)
	require.InEpsilon(t, 1.5, float64(batch.Cost)/float64(sync.Cost), 0.01, "half price, then full price")
}

// Config.OnSucceeded runs in the transaction that records each success,
// as a runner's does: its writes commit with the result. A hook that
// keeps failing for one result fails only that job's attempt, as a
// transient failure recorded without the hook.
func TestSubmitterRunsTheSucceededHook(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	_, err := h.db.Pool.Exec(t.Context(), "CREATE TABLE "+h.db.Schema+".delivered (job_id uuid PRIMARY KEY)")
	require.NoError(t, err)
	texts := make([]string, 12)
	for i := range texts {
		texts[i] = invoice(i, "")
	}
	texts = append(texts, invoice(99, "poison"))
	ids := h.enqueue(texts...)
	cfg := h.cfg
	cfg.Retry = llmqtype.BackoffPolicy{Base: time.Millisecond, Cap: time.Millisecond}
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		if strings.Contains(string(job.Payload), "poison") {
			return errors.New("the ERP refuses this supplier")
		}
		// The hook sees the whole job as recorded, as a runner's does.
		if job.State != jobs.StateSucceeded || len(job.Result) == 0 || job.Queue != batchQueue || job.CreatedAt.IsZero() {
			return fmt.Errorf("the hook saw job %s as %s in queue %q with result %q", job.ID, job.State, job.Queue, job.Result)
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+h.db.Schema+".delivered VALUES ($1)", job.ID.String())
		return err
	}
	s := h.submitter(cfg)
	h.passUntil(s, "all finished", func() bool {
		st := h.states()
		return st[jobs.StateSucceeded]+st[jobs.StateFailedTerminal] == len(ids)
	})
	var delivered int
	require.NoError(t, h.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+h.db.Schema+".delivered").Scan(&delivered))
	require.Equal(t, 12, delivered, "one delivery per success, written with it")
	for _, id := range ids[:12] {
		require.Equal(t, jobs.StateSucceeded, h.job(id).State)
	}
	poisoned := h.job(ids[12])
	require.Equal(t, jobs.StateFailedTerminal, poisoned.State)
	require.Equal(t, jobs.ClassTransient, poisoned.ErrorClass)
	require.Contains(t, poisoned.LastError, "OnSucceeded hook: the ERP refuses this supplier")
	require.Len(t, h.attempts(ids[12]), 3, "retried up to MaxAttempts, in later batches")
}

// Jobs of one key that opted in to reuse go to the provider once: the
// first is sent in a batch while the others wait (their key is running),
// and once its result is applied they are recorded as reused by the next
// gather, sent to no provider, with the host's hook run for each.
func TestSubmitterSendsAReusableRequestOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, fakeprovider.Config{})
	_, err := h.db.Pool.Exec(t.Context(), "CREATE TABLE "+h.db.Schema+".delivered (job_id uuid PRIMARY KEY)")
	require.NoError(t, err)
	text := invoice(1, "")
	key, err := jobs.ReuseKey(map[string]string{"model": "gpt-test", "text": text})
	require.NoError(t, err)
	var ids []uuid.UUID
	for range 3 {
		res, err := extractKind.Enqueue(t.Context(), h.store, h.db.Pool, "acme", docArgs{Text: text},
			jobs.EnqueueOptions{Queue: batchQueue, DeadlineAt: time.Now().Add(48 * time.Hour), Reuse: &jobs.Reuse{Key: key}})
		require.NoError(t, err)
		ids = append(ids, res.Job.ID)
	}
	cfg := h.cfg
	cfg.OnSucceeded = func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+h.db.Schema+".delivered VALUES ($1)", job.ID.String())
		return err
	}
	s := h.submitter(cfg)
	h.passUntil(s, "all succeeded", h.allIn(jobs.StateSucceeded, len(ids)))

	stats := h.fake.Stats()
	require.Equal(t, int64(1), stats.BatchesCreated)
	subs := h.submissions()
	require.Len(t, subs, 1)
	require.Equal(t, 1, subs[0].Requests, "one request for the three jobs")
	require.Equal(t, jobs.AttemptSucceeded, h.attempts(ids[0])[0].Outcome)
	for _, id := range ids[1:] {
		j := h.job(id)
		require.Equal(t, ids[0], j.ReusedFrom)
		require.JSONEq(t, string(h.job(ids[0]).Result), string(j.Result))
		attempts := h.attempts(id)
		require.Equal(t, jobs.AttemptReused, attempts[len(attempts)-1].Outcome)
	}
	var delivered int
	require.NoError(t, h.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+h.db.Schema+".delivered").Scan(&delivered))
	require.Equal(t, 3, delivered, "the hook ran for each job, reused or not")
}
